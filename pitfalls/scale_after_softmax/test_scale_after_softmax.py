"""scale_after_softmax: the shared pair checks, rows that no longer sum to 1, a shrunk output."""

import math
import re

import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair, compare
from harness.catalogue.judge import measure
from pitfalls.scale_after_softmax import CARD


def test_rows_sum_to_one_over_sqrt_d_k(device):
    claimed = re.search(r"to\s+sum\s+to (\d+)/sqrt\(d_k\)", CARD.truth)
    assert claimed, "the card no longer says what the rows sum to"
    pair = registry.load("scale_after_softmax")
    sums = measure(pair, device, torch.float32).weights["bug"].sum(-1)
    expected = int(claimed[1]) / math.sqrt(pair.card.shape.d_k)
    assert torch.allclose(sums, torch.full_like(sums, expected))


def test_output_is_sqrt_d_k_times_smaller_than_its_weights_give(device):
    assert "Every output is sqrt(d_k) times smaller than its own" in CARD.why
    pair = registry.load("scale_after_softmax")
    bug = compare(pair, device, torch.float32, pair.card.shape, seed=0).bug  # float64, CPU
    _, module = build_pair(pair, pair.card.shape, seed=0)  # the same weights
    with torch.no_grad():
        v = module.double().W_v(pair.card.inputs(pair.card.shape, 0).x)
    own = bug.weights * math.sqrt(pair.card.shape.d_k)  # its weights, rows summing to 1
    assert torch.allclose(bug.output * math.sqrt(pair.card.shape.d_k), own @ v, atol=1e-5)
