"""rope_wrong_axis: a rotation per head instead of per token, and a module blind to order."""

import pytest
import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair
from harness.catalogue.judge import measure
from harness.catalogue.verdicts import Verdict
from harness.metrics import rounding
from harness.shapes import MODERN_SHAPE
from harness.testing import assert_rounding_only, claimed
from pitfalls.rope_wrong_axis import CARD

PAIR = registry.load("rope_wrong_axis")
CPU = torch.device("cpu")


def test_raises_only_for_more_than_one_and_fewer_tokens_than_heads():
    heads, first, last = claimed(CARD, r"with (\d) heads: calls of (\d) or (\d) tokens")
    shape = MODERN_SHAPE
    assert shape.heads == int(heads) != shape.seq_len
    raising = set()
    for T in range(1, shape.seq_len + 1):
        module = PAIR.buggy.Attention(shape.d_model, shape.heads, shape.heads // 2)
        try:
            with torch.no_grad():
                module(torch.randn(1, T, shape.d_model))
        except RuntimeError:
            raising.add(T)
    assert raising == set(range(int(first), int(last) + 1))
    m = measure(PAIR, CPU, torch.float32, search=False)
    assert m.error is None and m.verdict is Verdict.SILENT, m.reason
    assert m.variants["1 head"].startswith("SILENT"), m.variants


def swap_changes(device):
    """How far swapping tokens 0 and 1 moves the outputs at t >= 2, per file (float32), and the
    size of those outputs."""
    fix, bug = build_pair(PAIR, MODERN_SHAPE, 0)
    x = PAIR.card.inputs(MODERN_SHAPE, 0).x.float().to(device)
    swapped = x[:, [1, 0, *range(2, MODERN_SHAPE.seq_len)]]
    found, size = {}, 0.0
    with torch.no_grad():
        for name, module in (("fixed", fix.to(device)), ("buggy", bug.to(device))):
            before, _ = module(x)
            after, _ = module(swapped)
            found[name] = (after[:, 2:] - before[:, 2:]).abs().max().item()
            size = max(size, before.abs().max().item())
    return found, size


def test_swapping_two_early_tokens_moves_later_outputs_only_when_fixed(device):
    (fix,) = claimed(CARD, r"exactly 0 on some CPUs\), against ([\d.]+)\s+with fixed")
    found, size = swap_changes(device)
    assert_rounding_only(CARD, found["buggy"], size)
    assert found["fixed"] > 1000 * rounding(size), found
    if device.type == "cpu":  # the card's figure is the CPU's
        assert found["fixed"] == pytest.approx(float(fix), abs=5e-4)


def test_full_scenario_output_error_is_the_cards():
    (out,) = claimed(CARD, r"outputs differ from fixed.py's by ([\d.]+) \(float32\)")
    m = measure(PAIR, CPU, torch.float32, search=False)
    assert m.output.set_index("run").loc["bug", "max_abs"] == pytest.approx(float(out), abs=5e-4)
