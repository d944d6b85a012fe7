"""fill_overflow_half: the shared pair checks, and the exact float16 error."""

import torch

import pitfalls
from harness.measure import measure
from harness.testing import pair_tests

test_fixed_matches_sdpa, test_verdict_matches_card, test_diff_is_small_and_marked = pair_tests(
    "fill_overflow_half"
)


def test_float16_raises_the_overflow_error_and_the_others_are_fine(device):
    pair = pitfalls.load("fill_overflow_half")
    half = measure(pair, device, torch.float16)
    assert "without overflow" in half.error
    assert measure(pair, device, torch.bfloat16).reason.startswith("output and every gradient")
