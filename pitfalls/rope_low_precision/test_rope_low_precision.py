"""rope_low_precision: positions and angles rounded in half precision, per dtype and offset."""

import math

import pytest
import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair
from harness.catalogue.judge import measure
from harness.catalogue.verdicts import Verdict, combine
from harness.devices import DTYPES
from harness.runner import as_dtype
from harness.scenarios import LONG_OFFSET
from harness.shapes import MODERN_SHAPE
from harness.testing import claimed, number
from pitfalls.rope_low_precision import CARD

PAIR = registry.load("rope_low_precision")
CPU = torch.device("cpu")
OFFSETS = (0, 1_000, 4096, LONG_OFFSET)


def positions(device, offset):
    arange = torch.arange(offset, offset + MODERN_SHAPE.seq_len, device=device)
    return arange.expand(MODERN_SHAPE.batch, -1)  # (B, T)


def logits(rotary, module, x, pos):
    """(B, h, T, T) attention logits of ``module`` with ``rotary``; the masked entries are 0."""
    B, T, _ = x.shape
    q = module.W_q(x).view(B, T, module.n_heads, module.d_head).transpose(1, 2)
    k = module.W_k(x).view(B, T, module.n_kv_heads, module.d_head).transpose(1, 2)
    q, k = rotary(q, pos), rotary(k, pos)
    k = k.repeat_interleave(module.n_heads // module.n_kv_heads, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(module.d_head)
    causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    return scores.masked_fill(~causal, 0.0).double()


def sweep(device, dtype, what="output"):
    """{offset: (fixed.py's error, buggy.py's error)} against fixed.py in float64."""
    fix, bug = build_pair(PAIR, MODERN_SHAPE, 0)
    x = PAIR.card.inputs(MODERN_SHAPE, 0).x.to(device)
    ref = as_dtype(fix, device, torch.float64)
    low = {"fixed": as_dtype(fix, device, dtype), "buggy": as_dtype(bug, device, dtype)}
    found = {}
    with torch.no_grad():
        for offset in OFFSETS:
            pos = positions(device, offset)
            if what == "output":
                truth = ref(x, positions=pos)[0]
                got = [low[s](x.to(dtype), positions=pos)[0].double() for s in ("fixed", "buggy")]
            else:
                truth = logits(PAIR.fixed.rotary, ref, x, pos)
                files = {"fixed": PAIR.fixed, "buggy": PAIR.buggy}
                got = [logits(files[s].rotary, low[s], x.to(dtype), pos) for s in files]
            found[offset] = tuple((g - truth).abs().max().item() for g in got)
    return found


def test_bfloat16_error_grows_with_the_offset_for_buggy_only(device):
    errors = sweep(device, torch.bfloat16)
    fixed_errors = [fix for fix, _ in errors.values()]
    assert max(fixed_errors) < 2 * min(fixed_errors), errors  # fixed.py: the same at any offset
    fix0, bug0 = errors[0]
    assert bug0 <= 2 * fix0 + 1e-3, errors  # small positions are exact in bfloat16
    for offset in (4096, LONG_OFFSET):
        fix, bug = errors[offset]
        assert bug > 10 * fix, errors


def test_float16_breaks_past_its_range_and_float32_is_the_fix(device):
    half = sweep(device, torch.float16)
    assert math.isnan(half[LONG_OFFSET][1]) and math.isfinite(half[LONG_OFFSET][0]), half
    assert half[4096][1] > 10 * half[4096][0], half
    full = sweep(device, torch.float32)
    assert all(fix == bug for fix, bug in full.values()), full  # the same arithmetic


def test_positions_round_as_the_card_says():
    rounded, spacing = claimed(CARD, r"round to ([\d,]+) \(bfloat16's spacing is (\d+) there\)")
    (largest,) = claimed(CARD, r"past the largest float16 \(([\d,]+)\)")
    pos = positions(CPU, LONG_OFFSET)[0]
    assert (pos.to(torch.bfloat16).double() == number(rounded)).all()
    value = torch.tensor(number(rounded), dtype=torch.bfloat16)
    above = torch.nextafter(value, torch.tensor(math.inf, dtype=torch.bfloat16))
    assert above.item() - number(rounded) == int(spacing)
    assert torch.finfo(torch.float16).max == number(largest)
    assert torch.isinf(pos.to(torch.float16)).all()


def test_the_cards_figures_are_measured():
    (bug, rounding) = claimed(
        CARD,
        r"same output error for both, float32 rounding \(BENIGN\).*error against the float64 "
        r"module is ([\d.]+) where fixed.py's bfloat16 error, its rounding, stays under ([\d.]+),",
    )
    logit_bug, largest, logit_rounding = claimed(
        CARD,
        r"logits are off by up to ([\d.]+) where the largest is ([\d.]+) \(fixed.py: under "
        r"([\d.]+)\)",
    )
    (bound,) = claimed(CARD, r"its logits stay within ([\d.]+)\.")
    (from_offset,) = claimed(CARD, r"already from offset ([\d,]+) on")
    measured = {name: measure(PAIR, CPU, d, search=False) for name, d in DTYPES.items()}
    verdicts = {name: m.verdict for name, m in measured.items()}
    assert verdicts["float32"] is Verdict.BENIGN and combine(verdicts) is Verdict.NUMERIC
    full = measured["float32"].output.set_index("run")
    assert full.loc["bug", "max_abs"] == full.loc["fix", "max_abs"]
    assert full.loc["bug", "max_abs"] <= full.loc["bug", "threshold"]  # rounding: a bound
    low = measured["bfloat16"].output.set_index("run")
    noise = low.loc["bug", "threshold"]  # bfloat16 kernels round otherwise on other CPUs
    assert low.loc["fix", "max_abs"] <= noise <= float(rounding)
    assert low.loc["bug", "max_abs"] == pytest.approx(float(bug), abs=noise)
    assert "nan" in measured["float16"].reason, measured["float16"].reason
    errors = sweep(CPU, torch.bfloat16)
    assert errors[int(number(from_offset))][1] == pytest.approx(float(bug), abs=noise)
    logit_errors = sweep(CPU, torch.bfloat16, what="logits")
    assert logit_errors[LONG_OFFSET][0] <= float(logit_rounding)
    assert logit_errors[LONG_OFFSET][1] == pytest.approx(float(logit_bug), abs=float(rounding))
    fix_module, _ = build_pair(PAIR, MODERN_SHAPE, 0)
    x = PAIR.card.inputs(MODERN_SHAPE, 0).x.float()
    with torch.no_grad():
        scale = logits(PAIR.fixed.rotary, fix_module, x, positions(CPU, LONG_OFFSET)).abs().max()
    assert scale.item() == pytest.approx(float(largest), abs=5e-3) and scale < float(bound)
