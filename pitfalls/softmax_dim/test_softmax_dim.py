"""softmax_dim: the shared pair checks, and what the implicit dim really is."""

import torch

from harness.catalogue import registry
from harness.catalogue.judge import measure


def test_implicit_dim_is_the_batch_axis(device):
    m = measure(registry.load("softmax_dim"), device, torch.float32)
    bug = m.weights["bug"]  # (B, T, T)
    assert torch.allclose(bug.sum(0), torch.ones_like(bug[0]))  # normalized over the batch
    assert any("Implicit dimension choice for softmax" in w for w in m.warnings)


def test_batch_of_one_gives_weights_of_exactly_one(device):
    pair = registry.load("softmax_dim")
    m = measure(pair, device, torch.float32, shape=pair.card.shape.with_(batch=1))
    assert (m.weights["bug"] == 1.0).all()
