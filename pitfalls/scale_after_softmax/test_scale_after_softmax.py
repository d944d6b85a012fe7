"""scale_after_softmax: the shared pair checks, and rows that no longer sum to 1."""

import math

import torch

import pitfalls
from harness.measure import measure
from harness.testing import pair_tests

test_fixed_matches_sdpa, test_verdict_matches_card, test_diff_is_small_and_marked = pair_tests(
    "scale_after_softmax"
)


def test_rows_sum_to_one_over_sqrt_d_k(device):
    pair = pitfalls.load("scale_after_softmax")
    sums = measure(pair, device, torch.float32).weights["bug"].sum(-1)
    assert torch.allclose(sums, torch.full_like(sums, 1 / math.sqrt(pair.card.shape.d_k)))
