"""softcap_after_mask: masked keys get weight, the future leaks, and how it scales with the cap."""

import inspect
import math

import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair
from harness.dependency import future_leak
from harness.metrics import rounding
from harness.testing import claimed_numbers
from pitfalls.softcap_after_mask import CARD, DEFAULT_CAP, GEMMA_CAP, leak

CPU = torch.device("cpu")


def close(found: float, figure: float) -> bool:
    """``found`` is the card's ``figure`` within 5 % (the card rounds to 2 or 3 digits)."""
    return math.isclose(found, figure, rel_tol=0.05)


def test_the_default_cap_leaks_what_the_card_says():
    (cap, key, share, gap) = claimed_numbers(
        CARD,
        r"default softcap (\d+) a masked key gets up to (\d+\.\d+) .* up to (\d+\.\d+) of its "
        r"weight to future keys: .* off by (\d+\.\d+) in float32",
    )
    pair = registry.load("softcap_after_mask")
    for module in (pair.fixed, pair.buggy):
        assert inspect.signature(module.Attention).parameters["softcap"].default == cap
    assert cap == DEFAULT_CAP
    found = leak(registry.load("softcap_after_mask"), CPU, torch.float32, CARD.shape, cap)
    assert close(found["max weight on a masked key"], key), found
    assert close(found["max masked share of a row"], share), found
    assert close(found["max output difference"], gap), found


def test_small_and_gemma_caps():
    pair = registry.load("softcap_after_mask")
    (one, key) = claimed_numbers(CARD, r"With softcap (\d+) a masked key gets up to (\d+\.\d+)")
    found = leak(pair, CPU, torch.float32, CARD.shape, one)
    assert close(found["max weight on a masked key"], key), found
    (gemma, most) = claimed_numbers(CARD, r"with Gemma-2's (\d+) at most (\d+e-\d+)")
    assert gemma == GEMMA_CAP
    found = leak(pair, CPU, torch.float32, CARD.shape, gemma)
    assert close(found["max weight on a masked key"], most), found
    assert found["max output difference"] <= rounding(1.0)  # below float32 rounding: a bound


def test_the_first_query_reads_the_last_input_only_when_buggy(device):
    query, key = (int(n) for n in claimed_numbers(CARD, r"output (\d+) depends on input (\d+)"))
    fixed, buggy = build_pair(registry.load("softcap_after_mask"), CARD.shape, 0)
    x = CARD.inputs(CARD.shape, 0).x.to(device, torch.float32)
    assert future_leak(fixed.to(device), x) is None
    found = future_leak(buggy.to(device), x)
    assert found is not None and (found.query, found.key) == (query, key), found
    with torch.no_grad():
        share = buggy(x)[1].triu(1).sum(-1)  # (B, h, T): each query's weight on later keys
    assert share.amax(dim=(0, 1)).argmax().item() == 0  # the first query leaks most


def test_the_cap_barely_bends_the_scores_it_keeps(monkeypatch):
    largest, capped = claimed_numbers(
        CARD, r"the largest on the card's draw, (\d+\.\d+), is capped to (\d+\.\d+)"
    )
    fixed, _ = build_pair(registry.load("softcap_after_mask"), CARD.shape, 0)
    seen = []  # what fixed.py hands tanh: the raw scores / softcap
    tanh = torch.tanh
    monkeypatch.setattr(torch, "tanh", lambda t: seen.append(t) or tanh(t))
    with torch.no_grad():
        fixed.double()(CARD.inputs(CARD.shape, 0).x)
    (scaled,) = seen
    assert abs(scaled.abs().max().item() * DEFAULT_CAP - largest) < 5e-3
    assert abs(DEFAULT_CAP * math.tanh(largest / DEFAULT_CAP) - capped) < 5e-3
