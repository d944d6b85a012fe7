"""scale_after_softmax: the shared pair checks, and rows that no longer sum to 1."""

import math

import torch

from harness.catalogue import registry
from harness.catalogue.judge import measure


def test_rows_sum_to_one_over_sqrt_d_k(device):
    pair = registry.load("scale_after_softmax")
    sums = measure(pair, device, torch.float32).weights["bug"].sum(-1)
    assert torch.allclose(sums, torch.full_like(sums, 1 / math.sqrt(pair.card.shape.d_k)))
