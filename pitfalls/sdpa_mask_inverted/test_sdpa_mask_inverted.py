"""sdpa_mask_inverted: the shared pair checks, and attention to exactly the blocked keys."""

import torch

from harness.catalogue import registry
from harness.catalogue.compare import compare
from harness.catalogue.judge import measure
from pitfalls.sdpa_mask_inverted import CARD


def test_row_with_nothing_blocked_gets_zero_output(device):
    # The last query of a causal mask may see every key, so inverted it may see none: SDPA
    # returns 0 for such a row.
    assert "becomes all-blocked and SDPA returns 0 for it" in CARD.truth
    pair = registry.load("sdpa_mask_inverted")
    m = measure(pair, device, torch.float32)
    assert "buggy.py output at position" in m.probes["future leak"]
    assert m.reason.startswith("output error")
    keep = pair.card.inputs(pair.card.shape, 0).keep  # (B, T, T)
    nothing_blocked = keep.all(-1)  # (B, T): in this mask, only the last query
    assert nothing_blocked[:, -1].all() and nothing_blocked.sum() == pair.card.shape.batch
    output = compare(pair, device, torch.float32, pair.card.shape).bug.output
    assert (output[nothing_blocked] == 0).all() and (output[~nothing_blocked] != 0).any()
