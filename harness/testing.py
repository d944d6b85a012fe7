"""The checks every pair must pass, as test functions a pair's test file takes over.

``test_<id>.py`` does ``test_a, test_b, test_c = pair_tests("<id>")`` and adds the checks that are
specific to its trap.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pitfalls
from harness import metrics
from harness.devices import DTYPES
from harness.diffing import changed_line_count, unmarked
from harness.inputs import convert_mask
from harness.measure import Measurement, build_pair, dtype_name, measure
from harness.reference import agreement
from harness.shapes import Shape
from harness.strategies import awkward_shapes
from harness.verdicts import Verdict, combine

MAX_CHANGED_LINES = 8


def assert_fixed_matches_sdpa(
    pair: pitfalls.Pair, device: torch.device, dtype: torch.dtype, shape: Shape, seed: int
) -> None:
    """fixed.py's output is within 2x SDPA's own rounding error (+ atol) of float64 SDPA."""
    card = pair.card
    fixed, _ = build_pair(pair, shape, seed)
    inputs = card.inputs(shape, seed)
    module_mask = convert_mask(inputs.keep, card.convention, device, dtype)
    err, floor, tol = agreement(fixed, module_mask, inputs.x, inputs.keep, device, dtype)
    limit = metrics.threshold(floor, tol, metrics.OUTPUT_FACTOR)
    assert err.finite and err.max_abs <= limit, (
        f"{card.id}/fixed.py vs SDPA on {shape.label()} in {dtype_name(dtype)}: "
        f"max abs error {err.max_abs:.3g} > {limit:.3g} (SDPA floor {floor.max_abs:.3g})"
    )


def assert_hidden_by_one_head(pitfall_id: str, device: torch.device) -> Measurement:
    """SILENT with the card's several heads, BENIGN with one: single-head tests cannot see it."""
    m = measure(pitfalls.load(pitfall_id), device, torch.float32)
    assert m.shape.heads > 1 and m.verdict is Verdict.SILENT, m.reason
    assert m.variants["1 head"].startswith("BENIGN"), m.variants
    return m


def pair_tests(pitfall_id: str):
    """The three shared tests for one pair: SDPA agreement, verdict, diff size."""
    pair = pitfalls.load(pitfall_id)

    @settings(max_examples=20)
    @given(shape=awkward_shapes(pair.card.has_heads), seed=st.integers(0, 2**16))
    def test_fixed_matches_sdpa(device: torch.device, dtype: torch.dtype, shape: Shape, seed: int):
        """fixed.py agrees with F.scaled_dot_product_attention under the floor rule."""
        assert_fixed_matches_sdpa(pair, device, dtype, shape, seed)

    def test_verdict_matches_card(device: torch.device):
        """The verdict measured in float32, bfloat16 and float16 is the card's."""
        measured = {name: measure(pair, device, d) for name, d in DTYPES.items()}
        verdicts = {name: m.verdict for name, m in measured.items()}
        overall = combine(verdicts)
        reasons = "; ".join(f"{n}: {m.verdict} ({m.reason})" for n, m in measured.items())
        assert overall == pair.card.expected, f"{pitfall_id}: {reasons}"
        # NUMERIC: float32 is BENIGN, or NUMERIC itself when the edge inputs break it there.
        allowed = (Verdict.BENIGN, Verdict.NUMERIC) if overall is Verdict.NUMERIC else (overall,)
        assert verdicts["float32"] in allowed, f"{pitfall_id}: {reasons}"

    def test_diff_is_small_and_marked():
        """buggy.py and fixed.py differ in at most 8 lines, each marked # BUG / # FIX."""
        assert changed_line_count(pair.folder) <= MAX_CHANGED_LINES
        assert changed_line_count(pair.folder) > 0, "buggy.py and fixed.py are identical"
        assert unmarked(pair.folder) == [], "changed lines without their marker"

    return test_fixed_matches_sdpa, test_verdict_matches_card, test_diff_is_small_and_marked
