"""softmax_dim: the shared pair checks, and what the implicit dim really is."""

import torch

from harness.catalogue import registry
from harness.catalogue.judge import measure
from harness.testing import claimed
from pitfalls.softmax_dim import CARD


def test_implicit_dim_is_the_batch_axis(device):
    (dim,) = claimed(CARD, r"for a 3-D tensor the implicit dim is (\d+), the batch axis")
    m = measure(registry.load("softmax_dim"), device, torch.float32)
    bug = m.weights["bug"]  # (B, T, T)
    assert bug.dim() == 3
    sums = bug.sum(int(dim))
    assert torch.allclose(sums, torch.ones_like(sums))  # normalized over the batch
    assert any("Implicit dimension choice for softmax" in w for w in m.warnings)


def test_batch_of_one_gives_weights_of_exactly_one(device):
    batch, value = claimed(CARD, r"with batch (\d+) every weight is exactly ([\d.]+)\.")
    pair = registry.load("softmax_dim")
    m = measure(pair, device, torch.float32, shape=pair.card.shape.with_(batch=int(batch)))
    assert (m.weights["bug"] == float(value)).all()
