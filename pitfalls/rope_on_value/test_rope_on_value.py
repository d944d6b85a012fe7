"""rope_on_value: the same attention weights, but outputs that move with absolute position."""

import pytest
import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair
from harness.catalogue.judge import measure
from harness.shapes import MODERN_SHAPE
from harness.testing import assert_rounding_only, claimed, number
from pitfalls.rope_on_value import CARD

PAIR = registry.load("rope_on_value")
CPU = torch.device("cpu")


def shift_changes(device, offset):
    """How far a shift of every position by ``offset`` moves each file's outputs (float32), and
    the size of those outputs."""
    fix, bug = build_pair(PAIR, MODERN_SHAPE, 0)
    x = PAIR.card.inputs(MODERN_SHAPE, 0).x.float().to(device)
    arange = torch.arange(MODERN_SHAPE.seq_len, device=device).expand(MODERN_SHAPE.batch, -1)
    found, size = {}, 0.0
    with torch.no_grad():
        for name, module in (("fixed", fix.to(device)), ("buggy", bug.to(device))):
            before, _ = module(x, positions=arange)
            after, _ = module(x, positions=arange + offset)
            found[name] = (after - before).abs().max().item()
            size = max(size, before.abs().max().item())
    return found, size


def test_a_shift_of_every_position_moves_only_buggy(device):
    (offset,) = claimed(CARD, r"Shifting every position by ([\d,]+) changes")
    (bug,) = claimed(CARD, r"changes buggy.py's outputs by ([\d.]+) and fixed.py's by float32")
    found, size = shift_changes(device, int(number(offset)))
    assert_rounding_only(CARD, found["fixed"], size)
    assert found["buggy"] > 0.1, found
    if device.type == "cpu":  # the card's figure is the CPU's
        assert found["buggy"] == pytest.approx(float(bug), rel=0.01)


def test_same_weights_other_outputs():
    out, rel = claimed(CARD, r"differ from fixed.py's by ([\d.]+) \(relative L2 ([\d.]+)\)")
    (bound,) = claimed(CARD, r"its outputs stay within ([\d.]+)\.")
    m = measure(PAIR, CPU, torch.float32, search=False)
    assert torch.equal(m.weights["fix"], m.weights["bug"])
    bug = m.output.set_index("run").loc["bug"]
    assert bug["max_abs"] == pytest.approx(float(out), abs=5e-4)
    assert bug["rel_l2"] == pytest.approx(float(rel), abs=5e-4)
    assert m.outputs["ref"].abs().max() < float(bound)
