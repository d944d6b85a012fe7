"""qk_overflow_half: the shared pair checks, and where the NaN appears."""

import torch

import pitfalls
from harness.measure import measure
from harness.testing import pair_tests

test_fixed_matches_sdpa, test_verdict_matches_card, test_diff_is_small_and_marked = pair_tests(
    "qk_overflow_half"
)


def test_only_float16_overflows(device):
    pair = pitfalls.load("qk_overflow_half")
    assert "= nan" in measure(pair, device, torch.float16).reason
    for dtype in (torch.float32, torch.bfloat16):
        assert (
            measure(pair, device, dtype).reason == "within the floor, also with large activations"
        )
