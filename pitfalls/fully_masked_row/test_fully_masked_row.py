"""fully_masked_row: the shared pair checks, and one empty sequence poisoning every gradient."""

import torch
import torch.nn.functional as F

from harness.catalogue import registry
from harness.catalogue.compare import compare
from harness.inputs import generator
from pitfalls.fully_masked_row import CARD


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


def test_sdpa_returns_zero_for_a_query_with_no_allowed_key(device):
    assert "as SDPA's safe softmax returns 0 for such rows" in CARD.avoid
    gen = generator(0)
    q, k, v = (torch.randn(1, 3, 4, generator=gen).to(device) for _ in "qkv")
    allowed = torch.ones(3, 3, dtype=torch.bool, device=device)
    allowed[1] = False  # query 1 has no key at all
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    assert (out[0, 1] == 0).all() and torch.isfinite(out).all()
