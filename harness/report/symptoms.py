"""The report's way in from a symptom: which traps cause what a student sees, by measurement.

Each symptom is a rule over a trap's measurements; a trap is listed under a symptom only when its
own numbers show it, with the number as evidence. The training symptoms (NaN, a flat or slow
loss, great in training and wrong in generation) come from the learning probe, whose evidence
starts "training:"; when the report skips it, they are read off what one forward and backward
pass shows (NaN, a gradient far smaller than fixed.py's), and say so.

The rules read values the measurement gives (its tables, what its probes found in buggy.py, the
verdict with one head), never the sentences the report prints.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pandas as pd

from harness import learning
from harness.catalogue.card import NOT_NAMED
from harness.catalogue.judge import Measurement
from harness.catalogue.verdicts import Verdict
from harness.report.format import TRAINED, num
from harness.report.results import TrapResult

ENTROPY_SHIFT = 0.02  # normalized entropy moved this much: the map looks different
SATURATED = 0.5  # at least this fraction of rows put >= 0.99 of their weight on one key
GRAD_RATIO = 10.0  # a gradient norm this many times larger (or smaller) than fixed.py's
ROW_SUM = 1e-3  # rows that miss summing to 1 by more than this are not distributions


def trained(r: TrapResult, labels: tuple[str, ...]) -> str | None:
    """The learning probe's evidence when enough of its seeds (as for a claim) give one of
    ``labels``."""
    if r.learning is None or not r.learning.diagnosis.supports(labels):
        return None
    d = r.learning.diagnosis
    return f"{TRAINED}{d.label}: {d.evidence}"


def nan_loss(r: TrapResult) -> str | None:
    for m in r.cells:
        if m.bug_nonfinite:
            return f"{m.cell}: {m.reason}"
    return trained(r, (learning.NAN,))


def _ratios(m: Measurement) -> Iterator[tuple[str, float]]:
    grads = m.gradients
    if "ratio" not in grads:
        return
    for name, ratio in zip(grads["param"], grads["ratio"], strict=True):
        if name != "input x" and math.isfinite(ratio) and ratio > 0:
            yield name, ratio


def exploding(r: TrapResult) -> str | None:
    m = r.primary
    for name, ratio in _ratios(m):
        if ratio >= GRAD_RATIO:
            over = f" (mean over {m.seeds} seeds)" if m.seeds else ""
            return f"gradient of {name} {num(ratio)}x fixed.py's{over}"
    return None


def _attention(m: Measurement) -> pd.DataFrame:
    return m.attention.set_index("run")


def _saturation(m: Measurement) -> str | None:
    att = _attention(m)
    fix, bug = att.loc["fix", "saturated"], att.loc["bug", "saturated"]
    if bug >= SATURATED > fix:
        return f"{num(100 * bug)}% of rows saturated against {num(100 * fix)}%"
    return None


def _entropy_sweep(r: TrapResult) -> tuple[float, float, str] | None:
    """The widest entropy gap in a trap's own sweep table (fixed, buggy, where), if it has one."""
    for extra in r.extras:
        if {"entropy (fixed)", "entropy (buggy)"} <= set(extra.columns):
            gap = extra["entropy (fixed)"] - extra["entropy (buggy)"]
            row = extra.loc[gap.abs().idxmax()]
            where = f"{extra.columns[0]} {row.iloc[0]:g}"
            return row["entropy (fixed)"], row["entropy (buggy)"], where
    return None


def flat_loss(r: TrapResult) -> str | None:
    """Training that does not reach the threshold or needs more steps than fixed.py; without
    the learning probe, a weight's gradient starved on the trap's own measurement shape (a
    trigger shape's one-wide weights say nothing of training)."""
    if r.learning is not None and r.learning.diagnosis.kind != learning.NO_BASELINE:
        return trained(r, (learning.FLAT_LABEL, learning.SLOWER_LABEL))
    m = r.primary
    if m.trigger is not None:
        return None
    for name, ratio in _ratios(m):
        if ratio <= 1 / GRAD_RATIO:
            return f"gradient of {name} {num(ratio)}x fixed.py's"
    return None


def odd_map(r: TrapResult) -> str | None:
    """Rows that are not distributions, saturated rows, or entropy moved; not for a BENIGN trap,
    whose map moves within what a correct module does (init_variance: the default init against
    xavier, both healthy)."""
    m = r.primary
    if r.overall(m.device) is Verdict.BENIGN:
        return None
    att = _attention(m)
    fix, bug = att.loc["fix"], att.loc["bug"]
    if bug["row_sum_err"] > ROW_SUM >= fix["row_sum_err"]:
        return f"rows miss summing to 1 by up to {num(bug['row_sum_err'])}"
    if saturated := _saturation(m):
        return saturated
    sweep = _entropy_sweep(r)  # a trap's own sweep shows it where it bites
    if sweep and abs(sweep[0] - sweep[1]) >= ENTROPY_SHIFT:
        return f"entropy {num(sweep[0])} → {num(sweep[1])} ({sweep[2]})"
    shift = bug["entropy_mean"] - fix["entropy_mean"]
    if abs(shift) >= ENTROPY_SHIFT:
        toward = "toward one-hot" if shift < 0 else "toward uniform"
        if bug["entropy_mean"] > 1:
            toward = "above 1: weight on keys it must not see"
        entropies = f"{num(fix['entropy_mean'])} → {num(bug['entropy_mean'])}"
        return f"entropy {entropies} (d_k {m.shape.d_k}, {toward})"
    return None


def some_shapes(r: TrapResult) -> str | None:
    m = r.primary
    if m.verdict is Verdict.CONDITIONAL and m.trigger is not None:
        return f"raises on most shapes, runs silently on {m.trigger.label()}"
    if m.verdict is Verdict.SILENT and m.one_head is Verdict.BENIGN:
        return "wrong with several heads, right with one"
    return None


def raises(r: TrapResult) -> str | None:
    for m in r.cells:
        if m.raised and m.verdict is not Verdict.CONDITIONAL:
            return f"{m.cell}: {m.error}"
    return None


def inference(r: TrapResult) -> str | None:
    if evidence := trained(r, (learning.TOO_GOOD, learning.GENERATION, learning.EVALUATION)):
        return evidence
    card, m = r.pair.card, r.primary
    if card.how.cached and r.overall(m.device) is not Verdict.BENIGN:
        return (
            f"{card.scenario} through the cache differs from the full forward: {m.cell}: {m.reason}"
        )
    return next((f"{probe}: buggy.py {found}" for probe, found in m.bug_findings.items()), None)


def positions_only(r: TrapResult) -> str | None:
    """A modern trap measured on long positions, packed documents or left padding."""
    card = r.pair.card
    unusual = card.how.positions != "default" or card.mask == "left_padding"
    bites = any(c.verdict is not Verdict.BENIGN for c in r.cells)
    if not unusual or not bites:
        return None
    bitten = next(c for c in r.cells if c.verdict is not Verdict.BENIGN)
    inputs = "left-padded rows" if card.mask == "left_padding" else card.how.description
    return f"{inputs}: {bitten.cell}: {bitten.reason}"


@dataclass(frozen=True)
class Symptom:
    """What a student sees, what the harness measures for it, and the rule that finds it."""

    name: str
    measured_as: str
    evidence: Callable[[TrapResult], str | None]


SYMPTOMS = (
    Symptom(
        "The loss, or some rows of the weights, are NaN",
        "NaN or Inf in buggy.py's output or gradients, or a training loss that turns NaN",
        nan_loss,
    ),
    Symptom(
        "The loss explodes or training is unstable",
        f"a weight's gradient at least {GRAD_RATIO:g}x fixed.py's",
        exploding,
    ),
    Symptom(
        "The loss is flat or falls slowly",
        f"trained on a tiny task (copying a prompt, or recalling values by key: the learning "
        f"probe below), buggy.py never reaches {learning.THRESHOLD:.0%} of the answers right, "
        f"needs {learning.SLOWER:g}x fixed.py's steps, or ends {learning.ENDS_BELOW:g} below "
        f"its accuracy; without the learning probe, a weight's gradient at most "
        f"1/{GRAD_RATIO:g} of fixed.py's",
        flat_loss,
    ),
    Symptom(
        "The same attention for every input, one-hot rows, or rows that do not sum to 1",
        f"mean entropy moved by {ENTROPY_SHIFT:g} or more, saturated rows, or rows that do not "
        "sum to 1",
        odd_map,
    ),
    Symptom(
        "It works only for some shapes, or only with one head",
        "an error on most shapes but a silent run on others, or right only with one head",
        some_shapes,
    ),
    Symptom("It raises an error", "buggy.py raises on the shape measured", raises),
    Symptom(
        "Great in training, wrong in generation or at inference",
        "trained on a tiny task: it predicts tokens no causal model can know, answers right "
        "teacher-forced and wrong by generation, or worse in eval mode; else an output that "
        "depends on later inputs, two identical calls in eval mode that differ, or generation "
        "through the cache that differs from the full forward",
        inference,
    ),
    Symptom(
        "Wrong only on long contexts, padded batches or packed sequences",
        "measured on positions from 100,000, left-padded rows or two packed documents",
        positions_only,
    ),
)


def slow(r: TrapResult, timed: set[str]) -> str | None:
    if r.pair.card.id not in timed:
        return None
    return "wall-clock ratio buggy / fixed in timings.md, written beside this page by each run"


def index(results: list[TrapResult], timed: set[str]) -> list[tuple[str, str, list]]:
    """(symptom, how it is measured, [(trap id, evidence)]) for every symptom.

    The last entry lists what is left: silent traps no other symptom catches, which only a
    comparison with a reference shows.
    """
    found = []
    results = sorted(results, key=lambda r: r.pair.card.section == NOT_NAMED)  # tutorial's first
    for symptom in SYMPTOMS:
        hits = [(r.pair.card.id, e) for r in results if (e := symptom.evidence(r))]
        found.append((symptom.name, symptom.measured_as, hits))
    hits = [(r.pair.card.id, e) for r in results if (e := slow(r, timed))]
    found.append(("It is slow", "wall-clock time, kept apart from this file as it varies", hits))
    listed = {trap for _, _, hits in found for trap, _ in hits}
    rest = [
        (r.pair.card.id, f"{r.primary.cell}: {r.primary.reason}")
        for r in results
        if r.pair.card.id not in listed and r.overall(r.primary.device) is not Verdict.BENIGN
    ]
    found.append(
        ("Nothing looks wrong, but a reference disagrees", "output error beyond the floor", rest)
    )
    return found
