"""fill_too_small: the shared pair checks, and masked keys leaking back on large logits."""

import math
import re

import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair, compare
from pitfalls.fill_too_small import CARD


def test_masked_keys_get_weight_only_with_large_logits(device):
    pair = registry.load("fill_too_small")
    blocked = ~pair.card.inputs(pair.card.shape, 0).keep
    for edge, leaks in ((False, False), (True, True)):
        weights = compare(pair, device, torch.float32, pair.card.shape, edge=edge).bug.weights
        assert bool((weights[blocked] > 0.01).any()) is leaks


def test_large_logits_fall_below_the_cards_fill_value():
    """The fill the card names is buggy.py's, and the edge inputs take logits below it."""
    fill = re.search(r"once logits fall below (-1e\d+)", CARD.truth)
    assert fill and f"masked_fill(mask == 0, {fill[1]})" in CARD.trap
    pair = registry.load("fill_too_small")
    assert f"masked_fill(mask == 0, {fill[1]})" in (pair.folder / "buggy.py").read_text()
    shape = pair.card.shape
    fixed, _ = build_pair(pair, shape, seed=0)
    with torch.no_grad():
        for edge, below in ((False, False), (True, True)):
            x = pair.card.inputs(shape, 0, edge=edge).x.float()
            scores = fixed.float().W_q(x) @ fixed.float().W_k(x).mT / math.sqrt(shape.d_k)
            assert bool((scores < float(fill[1])).any()) is below
