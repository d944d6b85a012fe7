"""mask_bool: the shared pair checks, and where the buggy mask sends attention."""

import torch

from harness.catalogue import registry
from harness.catalogue.judge import measure


def test_buggy_attends_only_to_the_future(device):
    weights = measure(registry.load("mask_bool"), device, torch.float32).weights["bug"]  # (B, T, T)
    last = weights[:, -1]  # every key of the last query is allowed, so every key is blocked
    assert last.isnan().all()
    rows = weights[:, :-1]
    past_or_self = torch.ones(rows.shape[-2], rows.shape[-1], dtype=torch.bool).tril()
    assert (rows[:, past_or_self] == 0).all(), "weight on a key the keep-mask allows"
