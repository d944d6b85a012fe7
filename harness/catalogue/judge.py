"""Judge a pair: a verdict from comparisons on ordinary shapes, trigger shapes and edge inputs.

Ordinary inputs first: a bug that raises is searched for trigger shapes (CONDITIONAL when one
lets it run and diverge, LOUD otherwise); one that diverges is SILENT. A bug within the floor is
then tried on the card's edge inputs: NaN, Inf or an error there is NUMERIC, a finite divergence
SILENT. Multi-head traps are also judged with one head; a trap whose bug is the weights is judged
over seeds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import pandas as pd
import torch
from torch import Tensor

from harness.catalogue.card import Pair
from harness.catalogue.compare import Comparison, MeasurementError, compare
from harness.catalogue.search import find_trigger
from harness.catalogue.seeds import compare_over_seeds
from harness.catalogue.verdicts import Verdict
from harness.devices import dtype_name
from harness.masks import CAUSAL_KINDS
from harness.runner import INPUT_GRAD
from harness.shapes import Shape


@dataclass
class Measurement:
    """The measured behaviour of one trap on one device and dtype."""

    pitfall: str
    device: str
    dtype: str
    shape: Shape  # the shape the tables and weights come from (a CONDITIONAL trap's trigger)
    seed: int
    verdict: Verdict
    reason: str  # one line: why this verdict
    output: pd.DataFrame
    attention: pd.DataFrame
    gradients: pd.DataFrame
    error: str | None = None  # the bug's exception on the measurement shape, if it raised
    warnings: list[str] = field(default_factory=list)
    trigger: Shape | None = None  # smallest shape on which a CONDITIONAL bug runs silently
    weights: dict[str, Tensor | None] = field(default_factory=dict)  # fix/bug attention
    # fix/bug outputs on the same inputs, float64 on the CPU (empty when compared over seeds)
    outputs: dict[str, Tensor | None] = field(default_factory=dict)
    edge: bool = False  # the tables come from the card's edge inputs
    keep: Tensor | None = None  # the allowed keys (B, T, T) of the inputs the tables come from
    probes: dict[str, str] = field(default_factory=dict)  # causal leak, repeat calls
    bug_findings: dict[str, str] = field(default_factory=dict)  # what a probe found in buggy.py
    variants: dict[str, str] = field(default_factory=dict)  # e.g. the verdict with one head
    one_head: Verdict | None = None  # the verdict with one head, when it was measured
    seeds: int = 0  # > 0: compared over this many seeds instead of shared weights

    @property
    def cell(self) -> str:
        """Which device and dtype: ``cpu float32``."""
        return f"{self.device} {self.dtype}"

    @cached_property
    def raised(self) -> bool:
        """The tables hold no buggy run: it raised (LOUD, or NUMERIC by an error)."""
        return self.output.set_index("run").loc["bug", "differs"] is None

    @cached_property
    def bug_nonfinite(self) -> bool:
        """buggy.py ran and its output or a gradient holds NaN or Inf where fixed.py's does not."""
        if self.raised or self.seeds:
            return False
        out = self.output.set_index("run")
        fix_ok = math.isfinite(out.loc["fix", "max_abs"])
        grads = self.gradients.get("nonfinite_bug", pd.Series(dtype=float))
        return fix_ok and (not math.isfinite(out.loc["bug", "max_abs"]) or bool((grads > 0).any()))

    def summary(self) -> dict[str, object]:
        """One tidy row for summary tables."""
        out = self.output.set_index("run")
        att = self.attention.set_index("run")
        grads = self.gradients
        cos = grads.loc[grads["param"] != INPUT_GRAD, "cosine"] if "cosine" in grads else []
        return dict(
            pitfall=self.pitfall,
            device=self.device,
            dtype=self.dtype,
            verdict=str(self.verdict),
            err_bug=out.loc["bug", "max_abs"],
            floor=out.loc["fix", "max_abs"],
            threshold=out.loc["bug", "threshold"],
            entropy_fix=att.loc["fix", "entropy_mean"],
            entropy_bug=att.loc["bug", "entropy_mean"],
            grad_cosine_min=cos.min() if len(cos) else float("nan"),
            trigger=self.trigger.label() if self.trigger else "",
            error=self.error or "",
            reason=self.reason,
        )


Grid = list[tuple[torch.device, torch.dtype]]  # the (device, dtype) cells to measure

EDGE_NAMES = {"empty_row": "an all-padding sequence", "large": "large activations"}


def _judge(pair: Pair, device: torch.device, dtype: torch.dtype, cmp: Comparison, search: bool):
    """(verdict, reason, comparison to tabulate, trigger) for one ordinary comparison."""
    card = pair.card
    if not cmp.bug.ok:
        trigger = find_trigger(pair, device, dtype) if search else None
        if trigger is None:
            return Verdict.LOUD, f"raises: {cmp.bug.error}", cmp, None
        silent = compare(pair, device, dtype, trigger, cmp.seed)
        reason = (
            f"raises on {cmp.shape.label()}; runs silently on {trigger.label()}: "
            f"{_divergence_reason(silent)}"
        )
        return Verdict.CONDITIONAL, reason, silent, trigger
    if cmp.diverges:
        return Verdict.SILENT, _divergence_reason(cmp), cmp, None
    if card.edge == "none":
        return Verdict.BENIGN, "output and every gradient within the noise floor", cmp, None
    edge_name = EDGE_NAMES[card.edge]
    try:
        leaks = card.mask in CAUSAL_KINDS  # a leak may show only on the edge inputs
        edge = compare(pair, device, dtype, cmp.shape, cmp.seed, edge=True, probes=leaks)
    except MeasurementError as exc:
        reason = f"within the floor on ordinary inputs; {edge_name} not measurable here: {exc}"
        return Verdict.INCONCLUSIVE, reason, cmp, None
    if edge.fix.first_nonfinite is not None:  # out of the dtype's range for any module
        reason = (
            f"within the floor on ordinary inputs; with {edge_name} even fixed.py is non-finite "
            f"here ({edge.fix.first_nonfinite}), so that case tells nothing in this dtype"
        )
        return Verdict.INCONCLUSIVE, reason, cmp, None
    if not edge.bug.ok:
        return Verdict.NUMERIC, f"with {edge_name}, raises: {edge.bug.error}", edge, None
    if edge.nonfinite:
        return Verdict.NUMERIC, f"with {edge_name}: {edge.bug.first_nonfinite}", edge, None
    if edge.diverges:
        return Verdict.SILENT, f"with {edge_name}: {_divergence_reason(edge)}", edge, None
    return Verdict.BENIGN, f"within the floor, also with {edge_name}", cmp, None


def measure(
    pair: Pair,
    device: torch.device,
    dtype: torch.dtype,
    seed: int = 0,
    shape: Shape | None = None,
    search: bool = True,
) -> Measurement:
    """Measure one trap on one device and dtype and give it a verdict.

    Ordinary inputs first: a bug that raises is searched for trigger shapes (CONDITIONAL when
    one lets it run and diverge, LOUD otherwise); one that diverges is SILENT. A bug within the
    floor is then tried on the card's edge inputs: NaN, Inf or an error there is NUMERIC, a
    finite divergence SILENT. Multi-head traps are also measured with one head.
    """
    if not pair.card.shared_weights:
        return _measure_over_seeds(pair, device, dtype, seed, shape)
    shape = shape or pair.card.shape
    cmp = compare(pair, device, dtype, shape, seed, probes=True)
    verdict, reason, shown, trigger = _judge(pair, device, dtype, cmp, search)
    variants, one_verdict = {}, None
    if pair.card.has_heads and shape.heads > 1:
        one = shape.with_(heads=1, d_k=shape.d_model, d_v=shape.d_model)
        single = compare(pair, device, dtype, one, seed)
        one_verdict, one_reason, _, _ = _judge(pair, device, dtype, single, search=False)
        variants["1 head"] = f"{one_verdict}: {one_reason}"
    said, found = edge_leak(shown, pair.card.edge)
    return Measurement(
        pitfall=pair.card.id,
        device=str(device),
        dtype=dtype_name(dtype),
        shape=shown.shape,
        seed=seed,
        verdict=verdict,
        reason=reason,
        output=shown.output,
        attention=shown.attention,
        gradients=shown.gradients,
        error=cmp.bug.error or shown.bug.error,
        warnings=sorted(set(cmp.bug.warnings) | set(shown.bug.warnings)),
        trigger=trigger,
        weights={"fix": shown.fix.weights, "bug": shown.bug.weights},
        outputs={
            "fix": shown.fix.output,
            "bug": shown.bug.output,
            "ref": shown.ref.output if shown.ref else None,
        },
        edge=shown.edge,
        keep=shown.keep,
        probes=cmp.probes | said,
        bug_findings=cmp.bug_findings | found,
        variants=variants,
        one_head=one_verdict,
    )


def edge_leak(shown: Comparison, edge: str) -> tuple[dict[str, str], dict[str, str]]:
    """The future-leak probe on the edge inputs, when the tables come from them: what it says,
    and what it found in buggy.py."""
    if not shown.edge:
        return {}, {}
    name = f"future leak with {EDGE_NAMES[edge]}"
    said, found = shown.probes.get("future leak"), shown.bug_findings.get("future leak")
    return ({name: said} if said else {}), ({name: found} if found else {})


def _divergence_reason(cmp: Comparison) -> str:
    bug = cmp.output.set_index("run").loc["bug"]
    where = cmp.bug.first_nonfinite
    if where is not None and cmp.fix.first_nonfinite is None:
        return f"non-finite: {where}"
    if bug["shape"] != cmp.output.set_index("run").loc["fix", "shape"]:
        return f"output shape {bug['shape']} instead of {cmp.output.iloc[0]['shape']}"
    if bug["differs"]:
        return f"output error {bug['max_abs']:.3g} > threshold {bug['threshold']:.3g}"
    worst = cmp.gradients[cmp.gradients["differs"].eq(True)].iloc[0]
    return f"gradient of {worst['param']}: error {worst['err_bug']:.3g} > {worst['threshold']:.3g}"


def _measure_over_seeds(
    pair: Pair, device: torch.device, dtype: torch.dtype, seed: int, shape: Shape | None
) -> Measurement:
    """A trap whose bug is the weights: judged by its attention over freshly seeded modules."""
    shape = shape or pair.card.shape
    s = compare_over_seeds(pair, device, dtype, shape, seed)
    return Measurement(
        pitfall=pair.card.id,
        device=str(device),
        dtype=dtype_name(dtype),
        shape=shape,
        seed=seed,
        verdict=s.verdict,
        reason=s.reason,
        output=s.output,
        attention=s.attention,
        gradients=s.gradients,
        error=s.error,
        weights=s.weights,
        keep=s.keep,
        seeds=s.n_seeds,
    )


def measure_grid(
    pairs: list[Pair], grid: Grid, step: Callable[[str], None] = lambda label: None
) -> list[Measurement]:
    """Measure every pair on every (device, dtype) of ``grid``, pair by pair; ``step`` is told
    each one before it starts (a progress bar)."""
    measurements = []
    for pair in pairs:
        for device, dtype in grid:
            step(f"{pair.card.id} {device} {dtype_name(dtype)}")
            measurements.append(measure(pair, device, dtype))
    return measurements
