"""fully_masked_row: the shared pair checks, and one empty sequence poisoning every gradient."""

import torch

from harness.catalogue import registry
from harness.catalogue.compare import compare


def test_one_empty_sequence_poisons_the_value_gradient_whole(device):
    pair = registry.load("fully_masked_row")
    ordinary = compare(pair, device, torch.float32, pair.card.shape)
    assert not ordinary.diverges
    edge = compare(pair, device, torch.float32, pair.card.shape, edge=True)
    assert edge.fix.first_nonfinite is None
    grads = edge.bug.grads
    assert grads["W_v.weight"].isnan().all()  # every entry, not just the empty sequence's share
    # The catalogue says every parameter; measured, masked_fill's backward zeroes the gradient
    # at every filled score, so the NaN never reaches W_q and W_k.
    assert torch.isfinite(grads["W_q.weight"]).all() and torch.isfinite(grads["W_k.weight"]).all()
