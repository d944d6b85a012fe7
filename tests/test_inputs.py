"""Seeded inputs and mask conventions."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.inputs import convert_mask, keep_mask, make_inputs
from harness.shapes import Shape
from harness.strategies import small_shapes


def test_same_seed_same_inputs_other_seed_other_inputs():
    shape = Shape()
    a, b, c = (make_inputs(shape, s, "both") for s in (1, 1, 2))
    assert torch.equal(a.x, b.x) and torch.equal(a.keep, b.keep)
    assert not torch.equal(a.x, c.x)


@given(shape=small_shapes(max_size=6), seed=st.integers(0, 1000), kind=st.sampled_from(
    ["causal", "padding", "both"]))  # fmt: skip
def test_every_mask_row_keeps_at_least_one_key(shape, seed, kind):
    keep = keep_mask(kind, shape, torch.Generator().manual_seed(seed))
    assert keep.shape == (shape.batch, shape.seq_len, shape.seq_len)
    assert keep.any(-1).all()


def test_conventions_encode_the_same_mask(device):
    keep = keep_mask("causal", Shape(), torch.Generator())
    assert torch.equal(convert_mask(keep, "keep", device, torch.float32).cpu(), keep)
    assert torch.equal(convert_mask(keep, "drop", device, torch.float32).cpu(), ~keep)
    additive = convert_mask(keep, "additive", device, torch.float32).cpu()
    assert torch.equal(additive == 0, keep) and torch.isinf(additive[~keep]).all()
    assert convert_mask(keep, "internal", device, torch.float32) is None
