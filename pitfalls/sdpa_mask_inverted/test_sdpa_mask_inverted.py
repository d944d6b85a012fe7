"""sdpa_mask_inverted: the shared pair checks, and attention to exactly the blocked keys."""

import torch

from harness.catalogue import registry
from harness.catalogue.judge import measure


def test_row_with_nothing_blocked_gets_zero_output(device):
    # The last query of a causal mask may see every key, so inverted it may see none: SDPA
    # returns 0 for such a row.
    m = measure(registry.load("sdpa_mask_inverted"), device, torch.float32)
    assert "buggy.py output at position" in m.probes["future leak"]
    assert m.reason.startswith("output error")
