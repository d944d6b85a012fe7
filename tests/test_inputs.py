"""Seeded inputs and mask conventions."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.catalogue.strategies import small_shapes
from harness.inputs import make_inputs, upstream_gradient
from harness.masks import CONVENTIONS, MaskSpec, encode, keep_mask
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


def test_causal_mask_lets_each_query_see_itself_and_the_past():
    keep = keep_mask("causal", 3, 4, torch.Generator())
    for t in range(4):
        assert keep[:, t].tolist() == [[s <= t for s in range(4)]] * 3


def test_padding_masks_keep_a_prefix_of_keys_and_the_first_sequence_whole():
    for seed in range(5):
        keep = keep_mask("padding", 6, 5, torch.Generator().manual_seed(seed))
        lengths = keep[:, 0].sum(-1)  # (B,)
        assert lengths[0] == 5
        for b, n in enumerate(lengths.tolist()):
            assert 1 <= n <= 5
            prefix = [s < n for s in range(5)]
            assert keep[b].tolist() == [prefix] * 5  # every query sees the same real keys
    assert any(  # padding happens
        (keep_mask("padding", 6, 5, torch.Generator().manual_seed(s))[:, 0].sum(-1) < 5).any()
        for s in range(5)
    )


def test_empty_padding_leaves_the_last_sequence_without_keys():
    keep = keep_mask("padding", 3, 4, torch.Generator().manual_seed(0), empty=True)
    assert not keep[-1].any()
    assert keep[0].all() and keep[:-1].any(-1).all()


def test_both_is_causal_and_padding_at_once():
    def gen():
        return torch.Generator().manual_seed(7)

    both = keep_mask("both", 4, 5, gen())
    assert torch.equal(both, keep_mask("causal", 4, 5, gen()) & keep_mask("padding", 4, 5, gen()))
    assert not torch.equal(both, keep_mask("causal", 4, 5, gen()))


def test_other_conventions_and_layouts():
    keep = keep_mask("padding", 3, 4, torch.Generator().manual_seed(1))
    lengths = keep[:, 0].sum(-1)
    key_padding = encode(keep, CONVENTIONS["key_padding"], torch.device("cpu"), torch.float32)
    assert key_padding.shape == (3, 4) and key_padding.dtype == torch.bool
    assert torch.equal(key_padding.sum(-1), lengths)  # True on the real keys
    keep_float = encode(keep, CONVENTIONS["keep_float"], torch.device("cpu"), torch.float16)
    assert keep_float.dtype == torch.float16 and torch.equal(keep_float, keep.half())
    per_head = MaskSpec("drop", layout="b1qk").encode(keep, torch.device("cpu"), torch.float32)
    assert per_head.shape == (3, 1, 4, 4) and torch.equal(per_head[:, 0], ~keep)
    extended = MaskSpec("additive", layout="b11k").encode(keep, torch.device("cpu"), torch.float32)
    assert extended.shape == (3, 1, 1, 4)  # BERT's: (B, 1, 1, T), 0 on real keys, -inf on padding
    assert torch.equal(extended[:, 0, 0] == 0, keep[:, 0])


def test_one_mask_for_every_sequence_holds_the_future_and_refuses_padding():
    cpu = torch.device("cpu")
    causal = keep_mask("causal", 3, 4, torch.Generator().manual_seed(1))
    shared = MaskSpec("keep", layout="qk").encode(causal, cpu, torch.float32)
    assert shared.shape == (4, 4) and torch.equal(shared, causal[0])
    padding = keep_mask("padding", 3, 4, torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="one for every sequence"):
        MaskSpec("keep", layout="qk").encode(padding, cpu, torch.float32)


def test_inputs_have_the_shape_scale_and_mask_asked_for():
    shape = Shape(batch=2, seq_len=3, d_model=4)
    small, large = make_inputs(shape, 0, "causal"), make_inputs(shape, 0, "causal", scale=100.0)
    assert small.x.shape == (2, 3, 4) and small.x.dtype == torch.float64
    assert torch.allclose(large.x, 100 * small.x, rtol=1e-15, atol=0)
    assert small.keep.shape == (2, 3, 3)
    assert make_inputs(shape, 0).keep is None


def test_upstream_gradient_is_seeded_and_not_the_input_again():
    shape = Shape()
    x = make_inputs(shape, 3).x
    G = upstream_gradient(x.shape, 3)
    assert torch.equal(G, upstream_gradient(x.shape, 3))
    assert not torch.equal(G, upstream_gradient(x.shape, 4))
    assert not torch.allclose(G, x)  # drawn from its own stream: no correlation with the input
