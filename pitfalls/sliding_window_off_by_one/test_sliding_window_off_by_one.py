"""sliding_window_off_by_one: which inputs each output reads, in the full forward and in decode."""

import pytest
import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair
from harness.scenarios import SCENARIOS, bounds, make_call
from harness.testing import claimed
from pitfalls.sliding_window_off_by_one import CARD, WINDOW


def outputs(module, side, x, scenario):
    """The (B, T, d) output of ``module`` (built from ``side``) on ``x``, called as
    ``scenario`` says (through ``side``'s own KVCache when it is a cached one)."""
    call = make_call(SCENARIOS[scenario], None, None, None, side.KVCache)
    with torch.no_grad():
        return call(module, x)[0]


def reads(module, side, x, scenario) -> set[tuple[int, int]]:
    """Every (t, s) such that redrawing input s moves output t."""
    before = outputs(module, side, x, scenario)
    found = set()
    for s in range(x.size(1)):
        redrawn = x.clone()
        noise = torch.randn(x[:, s].shape, generator=torch.Generator().manual_seed(s))
        redrawn[:, s] = noise.to(x)  # (B, d_model)
        moved = (outputs(module, side, redrawn, scenario) - before).abs().amax(dim=(0, 2))
        found |= {(t, s) for t in (moved > 1e-9).nonzero().flatten().tolist()}
    return found


@pytest.mark.parametrize("scenario", ["full", "decode"])
def test_output_t_reads_exactly_the_window_and_the_bug_one_more(device, scenario):
    bug, fix, start = claimed(
        CARD, r"inputs t - (\d) \.\. t instead of t - (\d) \.\. t from position (\d)"
    )
    assert (int(bug), int(fix), int(start)) == (WINDOW, WINDOW - 1, WINDOW)
    pair = registry.load("sliding_window_off_by_one")
    fixed, buggy = build_pair(pair, CARD.shape, 0)
    x = CARD.inputs(CARD.shape, 0).x.to(device)
    T = x.size(1)
    for module, side, width in ((fixed, pair.fixed, WINDOW), (buggy, pair.buggy, WINDOW + 1)):
        band = {(t, s) for t in range(T) for s in range(T) if t - width < s <= t}
        assert reads(module.to(device, torch.float64), side, x, scenario) == band, side.__name__
    if scenario == "decode":  # the one-token steps themselves lie past the window
        assert bounds("decode", T)[1] == (T // 2, T // 2 + 1) and T // 2 >= WINDOW


def test_outputs_differ_by_the_card_figure_and_not_at_all_below_the_window(device):
    (figure,) = claimed(CARD, r"differ from fixed.py's by up to (\d+\.\d+) in float32")
    fixed, buggy = build_pair(registry.load("sliding_window_off_by_one"), CARD.shape, 0)
    fixed, buggy = fixed.to(device, torch.float64), buggy.to(device, torch.float64)
    x = CARD.inputs(CARD.shape, 0).x.to(device)
    with torch.no_grad():
        gap = (buggy(x)[0] - fixed(x)[0]).abs()  # (B, T, d)
        assert gap[:, :WINDOW].max() == 0  # (B, w, d): no key t - w exists yet
        assert abs(gap.max().item() - float(figure)) < 5e-3, gap.max().item()
        short = x[:, :WINDOW]  # T <= w: the sequence fits in the window
        assert torch.equal(buggy(short)[0], fixed(short)[0])
