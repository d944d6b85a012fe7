"""dropout_in_eval: the shared pair checks, and randomness in eval mode."""

import torch

import pitfalls
from harness.measure import measure
from harness.testing import pair_tests

test_fixed_matches_sdpa, test_verdict_matches_card, test_diff_is_small_and_marked = pair_tests(
    "dropout_in_eval"
)


def test_two_eval_calls_differ_only_for_the_bug(device):
    probes = measure(pitfalls.load("dropout_in_eval"), device, torch.float32).probes
    fixed, buggy = probes["two identical calls in eval"].split("; ")
    assert fixed == "fixed.py identical" and buggy.startswith("buggy.py differ by up to")
