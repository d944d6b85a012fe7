"""sdpa_float_mask: the shared pair checks, and a mask that masks nothing."""

import torch

import pitfalls
from harness.measure import measure
from harness.testing import pair_tests

test_fixed_matches_sdpa, test_verdict_matches_card, test_diff_is_small_and_marked = pair_tests(
    "sdpa_float_mask"
)


def test_the_future_leaks_through_an_added_mask(device):
    probes = measure(pitfalls.load("sdpa_float_mask"), device, torch.float32).probes
    assert probes["future leak"].startswith("fixed.py none; buggy.py output at position")
