"""The checks every pair must pass, as assertions; ``pitfalls/test_pairs.py`` runs them over the
registry, and a trap's own test file adds only what is particular to its trap."""

from __future__ import annotations

import re

import torch

from harness import metrics
from harness.catalogue import registry
from harness.catalogue.card import Card, Pair
from harness.catalogue.compare import build_pair
from harness.catalogue.diffing import changed_line_count, unmarked
from harness.catalogue.judge import Measurement, measure
from harness.catalogue.verdicts import Verdict, combine
from harness.consistency import CACHED, agreements
from harness.dependency import future_leak
from harness.devices import DTYPES, dtype_name
from harness.masks import CAUSAL_KINDS, encode
from harness.reference import agreement
from harness.scenarios import SCENARIOS, make_call
from harness.shapes import Shape

MAX_CHANGED_LINES = 8


def assert_fixed_matches_sdpa(
    pair: Pair, device: torch.device, dtype: torch.dtype, shape: Shape, seed: int
) -> None:
    """fixed.py's output is within 2x SDPA's own rounding error (+ atol) of float64 SDPA."""
    card = pair.card
    fixed, _ = build_pair(pair, shape, seed)
    inputs = card.inputs(shape, seed)
    module_mask = encode(inputs.keep, card.spec, device, dtype)
    err, floor, tol = agreement(fixed, module_mask, inputs.x, inputs.keep, device, dtype)
    limit = metrics.threshold(floor, tol, metrics.OUTPUT_FACTOR)
    assert err.finite and err.max_abs <= limit, (
        f"{card.id}/fixed.py vs SDPA on {shape.label()} in {dtype_name(dtype)}: "
        f"max abs error {err.max_abs:.3g} > {limit:.3g} (SDPA floor {floor.max_abs:.3g})"
    )


def assert_fixed_keeps_its_properties(
    pair: Pair, device: torch.device, dtype: torch.dtype, shape: Shape, seed: int
) -> None:
    """A modern fixed.py gives its full forward however generation calls it (prefill then
    one-token steps, chunked prefill, a reset cache reused), within the floor, and a causal one
    never reads the future."""
    card = pair.card
    fixed, _ = build_pair(pair, shape, seed)
    inputs = card.inputs(shape, seed)
    new_cache = getattr(pair.fixed, "KVCache", None)
    if new_cache is not None:
        found = agreements(
            fixed, new_cache, inputs.x, inputs.keep, card.spec, inputs.positions, device, dtype,
            CACHED, seed,
        )  # fmt: skip
        wrong = [str(a) for a in found if not a.agrees]
        assert not wrong, f"{card.id}/fixed.py on {shape.label()}: {'; '.join(wrong)}"
    if card.mask in CAUSAL_KINDS:
        call = make_call(SCENARIOS["full"], inputs.keep, card.spec, inputs.positions, None)
        module = fixed.to(device, torch.float64)
        leak = future_leak(lambda x: call(module, x)[0], inputs.x.to(device))
        assert leak is None, f"{card.id}/fixed.py on {shape.label()}: {leak}"


def assert_verdict_matches_card(pair: Pair, device: torch.device) -> None:
    """The verdict measured in float32, bfloat16 and float16, combined, is the card's."""
    measured = {name: measure(pair, device, d) for name, d in DTYPES.items()}
    verdicts = {name: m.verdict for name, m in measured.items()}
    overall = combine(verdicts)
    reasons = "; ".join(f"{n}: {m.verdict} ({m.reason})" for n, m in measured.items())
    assert overall == pair.card.expected, f"{pair.card.id}: {reasons}"
    # NUMERIC: float32 is BENIGN, or NUMERIC itself when the edge inputs break it there.
    allowed = (Verdict.BENIGN, Verdict.NUMERIC) if overall is Verdict.NUMERIC else (overall,)
    assert verdicts["float32"] in allowed, f"{pair.card.id}: {reasons}"


def assert_diff_is_small_and_marked(pair: Pair) -> None:
    """buggy.py and fixed.py differ in 1 to 8 lines, each marked # BUG / # FIX."""
    changed = changed_line_count(pair.folder)
    assert 0 < changed <= MAX_CHANGED_LINES, f"{pair.card.id}: {changed} lines changed"
    assert unmarked(pair.folder) == [], "changed lines without their marker"


def assert_hidden_by_one_head(pitfall_id: str, device: torch.device) -> Measurement:
    """SILENT with the card's several heads, BENIGN with one: single-head tests cannot see it."""
    m = measure(registry.load(pitfall_id), device, torch.float32)
    assert m.shape.heads > 1 and m.verdict is Verdict.SILENT, m.reason
    assert m.variants["1 head"].startswith("BENIGN"), m.variants
    return m


def claimed(card: Card, pattern: str, text: str | None = None) -> tuple[str, ...]:
    """The groups of ``pattern`` in the card's truth (or ``text``): the figures a trap's tests
    hold the card to. Fails when the card no longer says it."""
    found = re.search(pattern, card.truth if text is None else text)
    assert found, f"{card.id}: the card no longer says {pattern!r}: update the test with the text"
    return found.groups()


# How a card says that a difference is rounding: as a bound, since other CPUs round otherwise.
ROUNDING_WORDS = r"by float32 rounding only \(at most (\d+) ulps of their size"


def assert_rounding_only(card: Card, difference: float, size: float) -> None:
    """The card calls a float32 difference rounding (``ROUNDING_WORDS``, with the harness's own
    number of ulps) and ``difference``, between values of size ``size``, is within it."""
    (ulps,) = claimed(card, ROUNDING_WORDS)
    assert int(ulps) == metrics.ROUNDING_ULPS, f"{card.id}: the card's bound is not the harness's"
    bound = metrics.rounding(size, torch.float32)
    assert difference <= bound, f"{card.id}: {difference:.3g} is more than rounding ({bound:.3g})"


def claimed_numbers(card: Card, pattern: str) -> tuple[float, ...]:
    """``claimed`` as numbers (thousands separators allowed: 100,000)."""
    return tuple(number(g) for g in claimed(card, pattern))


def number(text: str) -> float:
    """A figure as the cards write it: ``100,000`` or ``4.5e-08``."""
    return float(text.replace(",", ""))
