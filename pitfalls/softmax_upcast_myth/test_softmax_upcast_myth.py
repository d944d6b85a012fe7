"""softmax_upcast_myth: the measured probability errors in float16 and bfloat16, and where the
belief would hold."""

import math
import re

import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair
from harness.testing import claimed
from pitfalls.softmax_upcast_myth import (
    CARD,
    EQUAL,
    HALVES,
    LENGTHS,
    ODD_LENGTHS,
    SPREADS,
    narrow_row_sum_error,
    score_draws,
    softmax_errors,
)


def rounds_to(value: float, written: str) -> bool:
    """``value`` written with as many significant digits as ``written`` is ``written``."""
    digits = len(re.sub(r"e.*|\D", "", written).lstrip("0"))
    return math.isclose(float(f"{value:.{digits - 1}e}"), float(written))


def test_the_draws_are_the_cards():
    lengths, spreads = claimed(
        CARD, r"rows each of ([\d, and]+) keys with logit spreads ([\d, and]+) its"
    )
    assert [int(n) for n in re.findall(r"\d+", lengths)] == list(LENGTHS)
    assert [float(s) for s in re.findall(r"\d+", spreads)] == list(SPREADS)
    (odd,) = claimed(CARD, r"ones; at ([\d, and]+) keys fewer than")
    assert [int(n) for n in re.findall(r"\d+", odd)] == list(ODD_LENGTHS)
    assert all(n % 8 == 0 for n in LENGTHS) and all(n % 8 for n in ODD_LENGTHS)
    assert {n for n, _, _ in score_draws()} == {*LENGTHS, *ODD_LENGTHS, EQUAL}


def test_softmax_in_the_dtype_is_the_upcast_one_within_the_cards_bounds(device):
    errors = claimed(CARD, r"near 1 \((\S+) in float16 and (\S+) in bfloat16\)")
    sums = claimed(CARD, r"within the unit roundoff \((\S+) and (\S+);")
    for dtype, error, row_sum in zip(HALVES, errors, sums, strict=True):
        eps = torch.finfo(dtype).eps  # the spacing at 1: a probability near 1 has half of it
        assert rounds_to(eps / 4, error) and rounds_to(eps / 2, row_sum), dtype
        found = [(n, softmax_errors(s, device, dtype)) for n, _, s in score_draws() if n != EQUAL]
        worst = max(f["max error, in dtype"] for _, f in found)
        assert worst <= eps / 4 + 1e-6, (dtype, worst)  # float32 inside, rounded once
        for n, f in found:  # each of n probabilities off by at most u = eps / 2 of itself,
            tiny = n * torch.finfo(dtype).smallest_normal * eps / 2  # subnormals: absolutely
            assert f["max |row sum - 1|, in dtype"] <= eps / 2 + tiny + 1e-6, (dtype, n, f)
        if device.type == "cpu":  # the card's words are the CPU's
            assert all(f["bit-identical"] for n, f in found if n in LENGTHS), dtype
            assert all(f["most ulps apart"] <= 1 for _, f in found), dtype
            assert all(f["fraction off the upcast"] < 1e-3 for _, f in found), dtype
        assert max(f["max error, upcast"] for _, f in found) >= worst - 1e-12  # upcast: no better


def test_buggy_and_fixed_weights_are_bit_identical_on_the_cards_draw():
    fixed, buggy = build_pair(registry.load("softmax_upcast_myth"), CARD.shape, 0)
    x = CARD.inputs(CARD.shape, 0).x
    with torch.no_grad():
        for dtype in HALVES:
            fix_out, fix_w = fixed.to(dtype)(x.to(dtype))
            bug_out, bug_w = buggy.to(dtype)(x.to(dtype))
            assert torch.equal(fix_w, bug_w) and torch.equal(fix_out, bug_out), dtype


def test_an_accumulator_in_the_dtype_is_where_the_belief_holds():
    half, bf16 = claimed(
        CARD, rf"{EQUAL} equal logits sum to (\d+\.\d+) in float16 and (\d+\.\d+) in"
    )
    equal = torch.zeros(4, EQUAL, dtype=torch.float64)
    cpu = torch.device("cpu")
    assert narrow_row_sum_error(equal, cpu, torch.float16) == float(half) - 1
    assert narrow_row_sum_error(equal, cpu, torch.bfloat16) == float(bf16) - 1
    assert softmax_errors(equal, cpu, torch.bfloat16)["max |row sum - 1|, in dtype"] == 0
