"""Comparing a pair whose bug is the weights themselves: over many seeds, not shared weights.

With independent weights the outputs differ trivially, so the question is not "how far from the
reference" but "is the attention still healthy". A variant is *degenerate* when most of its
attention rows are saturated (largest weight >= 0.99): such a row passes at most 1% of its
gradient to the other keys, so the query and key projections barely learn.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from harness import metrics
from harness.catalogue.card import Pair
from harness.catalogue.compare import MeasurementError
from harness.catalogue.verdicts import Verdict
from harness.devices import dtype_name
from harness.runner import INPUT_GRAD, SeedStats, seed_stats
from harness.shapes import Shape


@dataclass
class SeedComparison:
    """Fixed against buggy over seeds: the verdict and the tables behind it."""

    verdict: Verdict
    reason: str
    output: pd.DataFrame
    attention: pd.DataFrame
    gradients: pd.DataFrame
    error: str | None
    weights: dict[str, Tensor | None]
    n_seeds: int
    keep: Tensor | None = None  # the allowed keys of the inputs the weights were drawn on


def side_stats(
    pair: Pair, side: str, device: torch.device, dtype: torch.dtype, shape: Shape, seeds: range
) -> SeedStats:
    """``seed_stats`` of the pair's ``fixed`` or ``buggy`` module, on the card's inputs."""
    card = pair.card
    module = pair.fixed if side == "fixed" else pair.buggy
    return seed_stats(
        lambda s: card.build(module, s), card.inputs, card.spec, device, dtype, shape, seeds
    )


def compare_over_seeds(
    pair: Pair,
    device: torch.device,
    dtype: torch.dtype,
    shape: Shape,
    seed: int = 0,
) -> SeedComparison:
    """Compare fixed and buggy modules, each freshly initialised, over the card's seeds."""
    n_seeds = pair.card.n_seeds
    seeds = range(seed, seed + n_seeds)
    fix = side_stats(pair, "fixed", device, dtype, shape, seeds)
    if fix.error:
        raise MeasurementError(
            f"{pair.card.id}: the fixed module fails in {dtype_name(dtype)}: {fix.error}"
        )
    bug = side_stats(pair, "buggy", device, dtype, shape, seeds)
    fix_att, fix_norms = fix.attention, fix.grad_norms
    bug_att, bug_norms, bug_err = bug.attention, bug.grad_norms, bug.error
    nan = float("nan")
    if bug_err:
        verdict, reason = Verdict.LOUD, f"raises: {bug_err}"
        bug_att = {k: nan for k in fix_att}
    elif metrics.degenerate(bug_att["saturated"]) and not metrics.degenerate(fix_att["saturated"]):
        verdict = Verdict.SILENT
        reason = (
            f"attention degenerate over {n_seeds} seeds: {bug_att['saturated']:.0%} of rows "
            f"saturated (fixed: {fix_att['saturated']:.0%})"
        )
    else:
        verdict = Verdict.BENIGN
        reason = f"attention healthy over {n_seeds} seeds ({bug_att['saturated']:.0%} saturated)"
    gradients = pd.DataFrame(
        [
            dict(
                param=name,
                norm_fix=fix_norms[name],
                norm_bug=bug_norms.get(name, nan),
                ratio=bug_norms.get(name, nan) / fix_norms[name] if fix_norms[name] else nan,
            )
            for name in fix_norms
            if name != INPUT_GRAD
        ]
    )
    output = pd.DataFrame(
        [dict(run=r, max_abs=nan, floor=nan, threshold=nan, differs=False) for r in ("fix", "bug")]
    )
    return SeedComparison(
        verdict=verdict,
        reason=reason,
        output=output,
        attention=pd.DataFrame([dict(run="fix", **fix_att), dict(run="bug", **bug_att)]),
        gradients=gradients,
        error=bug_err,
        weights={"fix": fix.weights, "bug": bug.weights},
        n_seeds=n_seeds,
        keep=fix.keep,
    )
