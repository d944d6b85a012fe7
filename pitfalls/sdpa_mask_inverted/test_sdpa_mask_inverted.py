"""sdpa_mask_inverted: the shared pair checks, and attention to exactly the blocked keys."""

import torch

import pitfalls
from harness.measure import measure
from harness.testing import pair_tests

test_fixed_matches_sdpa, test_verdict_matches_card, test_diff_is_small_and_marked = pair_tests(
    "sdpa_mask_inverted"
)


def test_row_with_nothing_blocked_gets_zero_output(device):
    # The last query of a causal mask may see every key, so inverted it may see none: SDPA
    # returns 0 for such a row.
    m = measure(pitfalls.load("sdpa_mask_inverted"), device, torch.float32)
    assert "buggy.py output at position" in m.probes["future leak"]
    assert m.reason.startswith("output error")
