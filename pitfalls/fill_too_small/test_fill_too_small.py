"""fill_too_small: the shared pair checks, and masked keys leaking back on large logits."""

import torch

from harness.catalogue import registry
from harness.catalogue.compare import compare


def test_masked_keys_get_weight_only_with_large_logits(device):
    pair = registry.load("fill_too_small")
    blocked = ~pair.card.inputs(pair.card.shape, 0).keep
    for edge, leaks in ((False, False), (True, True)):
        weights = compare(pair, device, torch.float32, pair.card.shape, edge=edge).bug.weights
        assert bool((weights[blocked] > 0.01).any()) is leaks
