"""fill_too_small: the shared pair checks, and masked keys leaking back on large logits."""

import torch

import pitfalls
from harness.measure import compare
from harness.testing import pair_tests

test_fixed_matches_sdpa, test_verdict_matches_card, test_diff_is_small_and_marked = pair_tests(
    "fill_too_small"
)


def test_masked_keys_get_weight_only_with_large_logits(device):
    pair = pitfalls.load("fill_too_small")
    blocked = ~pair.card.inputs(pair.card.shape, 0).keep
    for edge, leaks in ((False, False), (True, True)):
        weights = compare(pair, device, torch.float32, pair.card.shape, edge=edge).bug.weights
        assert bool((weights[blocked] > 0.01).any()) is leaks
