"""mask_bool: the shared pair checks, and where the buggy mask sends attention."""

import torch

from harness.catalogue import registry
from harness.catalogue.judge import measure
from harness.inputs import generator
from pitfalls.mask_bool import CARD


def test_buggy_attends_only_to_the_future_and_the_blocked_row_is_uniform(device):
    assert "comes out uniform with the tutorial's -1e9" in CARD.truth
    weights = measure(registry.load("mask_bool"), device, torch.float32).weights["bug"]  # (B, T, T)
    last = weights[:, -1]  # every key of the last query is allowed, so every key is blocked
    assert (last == last[:, :1]).all(), "every blocked key the same weight"  # uniform, exactly
    assert torch.allclose(last.sum(-1), torch.ones(len(last), dtype=last.dtype))
    rows = weights[:, :-1]
    past_or_self = torch.ones(rows.shape[-2], rows.shape[-1], dtype=torch.bool).tril()
    assert (rows[:, past_or_self] == 0).all(), "weight on a key the keep-mask allows"


def test_with_minus_inf_the_fully_blocked_row_is_nan_instead(device):
    """The card's aside: the same bug with -inf instead of -1e9 gives a NaN last row."""
    assert "with -inf instead of -1e9 that row is NaN" in CARD.truth
    pair = registry.load("mask_bool")
    keep = pair.card.inputs(pair.card.shape, 0).keep.to(device)  # (B, T, T), causal
    scores = torch.randn(keep.shape, generator=generator(0)).to(device)
    weights = scores.masked_fill(keep, float("-inf")).softmax(-1)  # the bug, with -inf
    assert weights[:, -1].isnan().all() and not weights[:, :-1].isnan().any()


def test_in_float16_the_fill_itself_raises(device):
    """-1e9 is beyond float16's 65504: the fill raises before any attention is computed."""
    assert "In float16 the -1e9 fill itself raises (fill_overflow_half)" in CARD.truth
    m = measure(registry.load("mask_bool"), device, torch.float16)
    assert "without overflow" in m.reason, m.reason
