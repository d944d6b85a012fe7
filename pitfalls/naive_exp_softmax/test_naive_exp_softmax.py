"""naive_exp_softmax: the logits the edge inputs reach, and exactly which rows turn NaN."""

import math

import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair
from harness.testing import claimed_numbers
from pitfalls.naive_exp_softmax import CARD

HALF_LIMIT = math.log(torch.finfo(torch.float16).max)  # 11.09: exp overflows past it


def logits(edge: bool, monkeypatch) -> torch.Tensor:
    """fixed.py's masked scores (B, h, T, T) in float64: what it takes the row max of."""
    fixed, _ = build_pair(registry.load("naive_exp_softmax"), CARD.shape, 0)
    seen = []
    amax = torch.Tensor.amax
    with monkeypatch.context() as patch, torch.no_grad():
        patch.setattr(torch.Tensor, "amax", lambda t, *a, **k: seen.append(t) or amax(t, *a, **k))
        fixed.double()(CARD.inputs(CARD.shape, 0, edge=edge).x)
    (scores,) = seen
    return scores


def test_the_logit_ranges_are_the_cards(monkeypatch):
    (ordinary,) = claimed_numbers(CARD, r"ordinary inputs \(logits up to (\d+\.\d+)\)")
    high, low = claimed_numbers(CARD, r"the logits reach (\d+\.\d+) \(lowest (-\d+\.\d+)\)")
    limit, wide = claimed_numbers(
        CARD, r"overflows past (\d+\.\d+) .* overflow only past (\d+\.\d+)"
    )
    assert round(HALF_LIMIT, 2) == limit
    assert round(math.log(torch.finfo(torch.float32).max), 1) == wide
    assert round(math.log(torch.finfo(torch.bfloat16).max), 1) == wide
    assert abs(logits(False, monkeypatch).max().item() - ordinary) < 5e-3
    scores = logits(True, monkeypatch)
    finite = scores[scores.isfinite()]
    assert abs(finite.max().item() - high) < 0.05 and abs(finite.min().item() - low) < 0.05
    assert HALF_LIMIT < high < 60 < wide  # the range the card's input_scale aims at


def test_exactly_the_rows_past_the_float16_limit_turn_nan(device, monkeypatch):
    counts = claimed_numbers(
        CARD,
        r"in exactly the (\d+) of (\d+) attention rows .* to (\d+) of the (\d+) output positions",
    )
    rows, of, positions, out_of = (int(n) for n in counts)
    past = logits(True, monkeypatch).amax(-1) > HALF_LIMIT  # (B, h, T)
    assert (int(past.sum()), past.numel()) == (rows, of)
    fixed, buggy = build_pair(registry.load("naive_exp_softmax"), CARD.shape, 0)
    x = CARD.inputs(CARD.shape, 0, edge=True).x.to(device)
    with torch.no_grad():
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            fix_out, _ = fixed.to(device, dtype)(x.to(dtype))
            out, weights = buggy.to(device, dtype)(x.to(dtype))
            assert fix_out.isfinite().all()
            nan_rows = weights.isnan().any(-1).cpu()  # (B, h, T)
            if dtype == torch.float16:
                assert torch.equal(nan_rows, past)
                nan_positions = out.isnan().any(-1)  # (B, T)
                assert (int(nan_positions.sum()), nan_positions.numel()) == (positions, out_of)
            else:
                assert not nan_rows.any() and out.isfinite().all()
