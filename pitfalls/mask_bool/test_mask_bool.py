"""mask_bool: the shared pair checks, and where the buggy mask sends attention."""

import torch

from harness.catalogue import registry
from harness.catalogue.judge import measure
from harness.inputs import generator
from pitfalls.mask_bool import CARD


def test_buggy_attends_only_to_the_future(device):
    weights = measure(registry.load("mask_bool"), device, torch.float32).weights["bug"]  # (B, T, T)
    last = weights[:, -1]  # every key of the last query is allowed, so every key is blocked
    assert last.isnan().all()
    rows = weights[:, :-1]
    past_or_self = torch.ones(rows.shape[-2], rows.shape[-1], dtype=torch.bool).tril()
    assert (rows[:, past_or_self] == 0).all(), "weight on a key the keep-mask allows"


def test_with_minus_1e9_the_fully_blocked_row_is_uniform_instead(device):
    """The card's aside: the same bug with -1e9 instead of -inf gives a uniform last row."""
    assert "with -1e9 instead of -inf it becomes uniform instead" in CARD.truth
    pair = registry.load("mask_bool")
    keep = pair.card.inputs(pair.card.shape, 0).keep.to(device)  # (B, T, T), causal
    scores = torch.randn(keep.shape, generator=generator(0)).to(device)
    weights = scores.masked_fill(keep, -1e9).softmax(-1)  # the bug, with -1e9
    last = weights[:, -1]
    assert torch.equal(last, torch.full_like(last, 1 / keep.shape[-1]))
