"""causal_leak: the shared pair checks, and the leak found by gradient dependency."""

import re

import torch

import pitfalls
from harness.measure import measure
from harness.testing import pair_tests

test_fixed_matches_sdpa, test_verdict_matches_card, test_diff_is_small_and_marked = pair_tests(
    "causal_leak"
)


def test_gradient_dependency_finds_the_next_position(device):
    leak = measure(pitfalls.load("causal_leak"), device, torch.float32).probes["future leak"]
    assert leak.startswith("fixed.py none; buggy.py output at position")
    found = re.search(r"position (\d+) depends on input (\d+)", leak)
    assert found and int(found[2]) == int(found[1]) + 1, leak
