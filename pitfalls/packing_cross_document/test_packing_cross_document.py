"""packing_cross_document: a packed document's outputs ignore the document before it."""

import re

import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair
from harness.catalogue.judge import measure
from harness.inputs import generator
from harness.scenarios import SCENARIOS, document_starts, make_call, positions_for
from harness.shapes import MODERN_SHAPE
from pitfalls.packing_cross_document import CARD

PAIR = registry.load("packing_cross_document")
B, T, D = 3, MODERN_SHAPE.seq_len, MODERN_SHAPE.d_model


def packed():
    """x (B, T, d) float64, its packed positions (B, T) and where the second document starts
    (B, T) bool, drawn as the harness's packed scenario draws them."""
    x = torch.randn(B, T, D, generator=generator(0), dtype=torch.float64)
    positions = positions_for(SCENARIOS["packed"], B, T, generator(7))
    second = torch.arange(T) >= document_starts(B, T, generator(7))[:, None]  # (B, T)
    return x, positions, second


def test_redrawing_the_first_document_moves_the_second_only_when_buggy(device):
    x, positions, second = packed()
    noise = torch.randn(B, T, D, generator=generator(1), dtype=torch.float64)
    redrawn = torch.where(second[..., None], x, noise)  # the first document redrawn
    fixed, buggy = build_pair(PAIR, MODERN_SHAPE, 0)
    moved = {}
    with torch.no_grad():
        for name, module in (("fixed", fixed), ("buggy", buggy)):
            module = module.to(device, torch.float64)
            before = module(x.to(device), positions=positions.to(device))[0]
            after = module(redrawn.to(device), positions=positions.to(device))[0]
            change = (after - before).abs().amax(-1).cpu()  # (B, T)
            moved[name] = change[second].max().item()
    said = re.search(r"by up to ([\d.]+) in buggy.py and by ([\d.]+) in fixed.py", CARD.truth)
    assert said, "the card no longer says how far the second document moves"
    assert moved["fixed"] <= float(said[2]) + 1e-12, moved
    assert abs(moved["buggy"] - float(said[1])) <= 0.05 * float(said[1]), moved


def test_the_document_mask_holds_under_a_cache(device):
    """The cache keeps each token's position, so one-token steps see the documents too."""
    x, positions, _ = packed()
    x, positions = x.to(device), positions.to(device)
    fixed, _ = build_pair(PAIR, MODERN_SHAPE, 0)
    fixed = fixed.to(device, torch.float64)
    with torch.no_grad():
        full = fixed(x, positions=positions)[0]
        for scenario in ("decode", "chunked"):
            call = make_call(SCENARIOS[scenario], None, None, positions, PAIR.fixed.KVCache)
            assert (call(fixed, x)[0] - full).abs().max() < 1e-6, scenario


def test_card_numbers_are_measured(device):
    said = re.search(r"the second is off by ([\d.]+) in float32", CARD.truth)
    assert said, "the card no longer gives the second document's error"
    m = measure(PAIR, device, torch.float32, search=False)
    floor = m.output.set_index("run").loc["bug", "threshold"]
    positions = PAIR.card.inputs(m.shape, m.seed).positions
    second = (positions == 0).cumsum(-1) == 2  # (B, T)
    error = (m.outputs["bug"] - m.outputs["ref"]).abs().amax(-1)  # (B, T)
    assert (error[~second] <= floor).all(), "the first document is already wrong"
    assert abs(error[second].max().item() - float(said[1])) <= 0.05 * float(said[1])
