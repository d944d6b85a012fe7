"""rope_cache_offset: every decoded token is rotated as position 0; the prefill is exact."""

import re

import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair
from harness.catalogue.judge import measure
from harness.scenarios import SCENARIOS, bounds, make_call
from harness.shapes import MODERN_SHAPE
from pitfalls.rope_cache_offset import CARD

PAIR = registry.load("rope_cache_offset")


def decode(module, new_cache, x, positions=None):
    """Prefill then one token per call through a fresh cache; the steps' outputs (B, T, d)."""
    return make_call(SCENARIOS["decode"], None, None, positions, new_cache)(module, x)[0]


def test_decoded_tokens_are_rotated_as_position_zero(device):
    fixed, buggy = build_pair(PAIR, MODERN_SHAPE, 0)
    fixed, buggy = fixed.to(device, torch.float64), buggy.to(device, torch.float64)
    B, T = 2, MODERN_SHAPE.seq_len
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, MODERN_SHAPE.d_model, generator=gen, dtype=torch.float64).to(device)
    prefill = bounds("decode", T)[0][1]
    as_zero = torch.arange(T).masked_fill(torch.arange(T) >= prefill, 0).expand(B, T)
    with torch.no_grad():
        full = fixed(x)[0]
        assert (decode(fixed, PAIR.fixed.KVCache, x) - full).abs().max() < 1e-6
        wrong = decode(buggy, PAIR.buggy.KVCache, x)
        assert torch.equal(wrong, decode(buggy, PAIR.buggy.KVCache, x, as_zero))
        assert (wrong[:, :prefill] - full[:, :prefill]).abs().max() < 1e-6
        assert (wrong[:, prefill:] - full[:, prefill:]).abs().amax(dim=(0, 2)).min() > 1e-2


def test_card_numbers_are_measured(device):
    said = re.search(
        r"by ([\d.]+) at the first decode step falling to ([\d.]+) at the last", CARD.truth
    )
    assert said, "the card no longer gives the first and last decode errors"
    m = measure(PAIR, device, torch.float32, search=False)
    floor = m.output.set_index("run").loc["bug", "threshold"]
    per_step = (m.outputs["bug"] - m.outputs["ref"]).abs().amax(dim=(0, 2))  # (T,)
    prefill = bounds("decode", m.shape.seq_len)[0][1]
    assert (per_step[:prefill] <= floor).all(), "the prefill itself is already wrong"
    for got, claimed in ((per_step[prefill], said[1]), (per_step[-1], said[2])):
        assert abs(got.item() - float(claimed)) <= 0.05 * float(claimed), per_step
