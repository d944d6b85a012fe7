"""softmax_dim: the shared pair checks, and what the implicit dim really is."""

import torch

import pitfalls
from harness.measure import measure
from harness.testing import pair_tests

test_fixed_matches_sdpa, test_verdict_matches_card, test_diff_is_small_and_marked = pair_tests(
    "softmax_dim"
)


def test_implicit_dim_is_the_batch_axis(device):
    m = measure(pitfalls.load("softmax_dim"), device, torch.float32)
    bug = m.weights["bug"]  # (B, T, T)
    assert torch.allclose(bug.sum(0), torch.ones_like(bug[0]))  # normalized over the batch
    assert any("Implicit dimension choice for softmax" in w for w in m.warnings)


def test_batch_of_one_gives_weights_of_exactly_one(device):
    pair = pitfalls.load("softmax_dim")
    m = measure(pair, device, torch.float32, shape=pair.card.shape.with_(batch=1))
    assert (m.weights["bug"] == 1.0).all()
