"""padding_on_queries: the shared pair checks, and weight on padded keys."""

import torch

from harness.catalogue import registry
from harness.catalogue.judge import measure


def test_real_queries_attend_to_padding(device):
    pair = registry.load("padding_on_queries")
    m = measure(pair, device, torch.float32)
    real_key = pair.card.inputs(pair.card.shape, 0).keep[:, 0]  # (B, T)
    bug = m.weights["bug"]  # (B, T, T)
    padded_rows = ~real_key[:, :, None].expand_as(bug)
    assert bug[padded_rows].isnan().all()  # padded queries: every key blocked
    leaked = bug.nan_to_num(0.0) * (~real_key[:, None, :])  # weight on padded keys
    assert leaked.sum() > 0.1
