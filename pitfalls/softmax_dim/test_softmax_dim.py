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
    allowed = ~bug.isnan().any(int(dim))  # (T, T): cells no batch element blocks
    sums = bug.sum(int(dim))[allowed]
    assert torch.allclose(sums, torch.ones_like(sums))  # normalized over the batch
    assert any("Implicit dimension choice for softmax" in w for w in m.warnings)


def test_under_the_causal_mask_every_row_but_the_last_is_nan(device):
    nan_rows, seq_len = map(int, claimed(CARD, r"NaN \((\d+) of (\d+) rows at T = \d+\)"))
    pair = registry.load("softmax_dim")
    assert pair.card.mask == "causal" and pair.card.shape.seq_len == seq_len
    m = measure(pair, device, torch.float32)
    for name in ("weights", "outputs"):
        rows = getattr(m, name)["bug"].isnan().any(-1)  # (B, T)
        assert (rows.sum(-1) == nan_rows).all(), name
        assert not rows[:, -1].any(), f"{name}: the last row sees every key, so no -inf column"
    assert m.outputs["fix"].isfinite().all()


def test_batch_of_one_gives_allowed_weights_of_exactly_one(device):
    batch, value = claimed(CARD, r"with batch (\d+) every allowed weight is exactly ([\d.]+)\.")
    pair = registry.load("softmax_dim")
    m = measure(pair, device, torch.float32, shape=pair.card.shape.with_(batch=int(batch)))
    weights = m.weights["bug"]  # (1, T, T)
    allowed = torch.ones(weights.shape[-2:], dtype=torch.bool).tril()
    assert (weights[:, allowed] == float(value)).all()
    assert weights[:, ~allowed].isnan().all()
