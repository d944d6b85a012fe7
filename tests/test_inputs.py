"""Seeded inputs and mask conventions."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.catalogue.strategies import small_shapes
from harness.inputs import make_inputs
from harness.masks import CONVENTIONS, encode, keep_mask
from harness.shapes import Shape


def test_same_seed_same_inputs_other_seed_other_inputs():
    shape = Shape()
    a, b, c = (make_inputs(shape, s, "both") for s in (1, 1, 2))
    assert torch.equal(a.x, b.x) and torch.equal(a.keep, b.keep)
    assert not torch.equal(a.x, c.x)


@given(shape=small_shapes(max_size=6), seed=st.integers(0, 1000), kind=st.sampled_from(
    ["causal", "padding", "both"]))  # fmt: skip
def test_every_mask_row_keeps_at_least_one_key(shape, seed, kind):
    keep = keep_mask(kind, shape.batch, shape.seq_len, torch.Generator().manual_seed(seed))
    assert keep.shape == (shape.batch, shape.seq_len, shape.seq_len)
    assert keep.any(-1).all()


def test_conventions_encode_the_same_mask(device):
    keep = keep_mask("causal", 2, 5, torch.Generator())

    def conv(name):
        return encode(keep, CONVENTIONS[name], device, torch.float32)

    assert torch.equal(conv("keep").cpu(), keep)
    assert torch.equal(conv("drop").cpu(), ~keep)
    additive = conv("additive").cpu()
    assert torch.equal(additive == 0, keep) and torch.isinf(additive[~keep]).all()
    assert conv("internal") is None
