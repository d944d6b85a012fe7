"""Measuring a pair whose bug is the weights themselves: over many seeds, not shared weights.

With independent weights the outputs differ trivially, so the question is not "how far from the
reference" but "is the attention still healthy". A variant is *degenerate* when most of its
attention rows are saturated (largest weight >= 0.99): such a row passes at most 1% of its
gradient to the other keys, so the query and key projections barely learn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd
import torch
from torch import Tensor, nn

from harness import metrics
from harness.inputs import convert_mask, upstream_gradient
from harness.runner import INPUT_GRAD, as_dtype, exact_float32, run, seeded
from harness.shapes import Shape
from harness.verdicts import Verdict

if TYPE_CHECKING:
    from harness.measure import Measurement
    from pitfalls import Pair

N_SEEDS = 16
DEGENERATE_SATURATION = 0.5  # a majority of rows saturated

Builder = Callable[[Shape], nn.Module]


@dataclass
class SeedStats:
    """One variant's behaviour over seeds."""

    attention: dict[str, float]  # averaged attention statistics (empty when it raised)
    grad_norms: dict[str, float]  # mean gradient norm per parameter
    error: str | None  # the first exception, if any
    weights: Tensor | None  # attention weights of the first seed, for pictures


def seed_stats(
    pair: Pair,
    builder: Builder,
    device: torch.device,
    dtype: torch.dtype,
    shape: Shape,
    seeds: range,
) -> SeedStats:
    """Attention statistics and gradient norms of ``builder``'s module, averaged over seeds."""
    card = pair.card
    att_rows, norms, first_weights = [], {}, None
    for seed in seeds:
        with seeded(seed):
            module = builder(shape).eval()
        inputs = card.inputs(shape, seed)
        mask = convert_mask(inputs.keep, card.convention, device, dtype)
        with exact_float32(device):
            result = run(
                as_dtype(module, device, dtype),
                inputs.x.to(device, dtype),
                mask,
                lambda out_shape, s=seed: upstream_gradient(out_shape, s),
            )
        if not result.ok:
            return SeedStats({}, {}, result.error, None)
        first_weights = result.weights if first_weights is None else first_weights
        att_rows.append(metrics.attention_stats(result.weights, inputs.keep))
        for name, grad in result.grads.items():
            norms.setdefault(name, []).append(metrics.grad_stats(grad)["norm"])
    att = pd.DataFrame(att_rows)
    row = dict(
        entropy_mean=att["entropy_mean"].mean(),
        entropy_std=att["entropy_mean"].std(ddof=0),
        entropy_min=att["entropy_min"].min(),
        saturated=att["saturated"].mean(),
        nan_rows=att["nan_rows"].sum(),
        row_sum_err=att["row_sum_err"].max(),
    )
    mean_norms = {k: sum(v) / len(v) for k, v in norms.items()}
    return SeedStats(row, mean_norms, None, first_weights)


def degenerate(row: dict[str, float]) -> bool:
    """True when most attention rows are saturated."""
    return row["saturated"] >= DEGENERATE_SATURATION


def measure_over_seeds(
    pair: Pair,
    device: torch.device,
    dtype: torch.dtype,
    seed: int = 0,
    shape: Shape | None = None,
    n_seeds: int = N_SEEDS,
) -> Measurement:
    """Compare fixed and buggy modules, each freshly initialised, over ``n_seeds`` seeds."""
    from harness.measure import Measurement, MeasurementError, dtype_name

    card = pair.card
    shape = shape or card.shape
    seeds = range(seed, seed + n_seeds)
    fix = seed_stats(pair, lambda s: card.build(pair.fixed, s), device, dtype, shape, seeds)
    if fix.error:
        raise MeasurementError(
            f"{card.id}: the fixed module fails in {dtype_name(dtype)}: {fix.error}"
        )
    bug = seed_stats(pair, lambda s: card.build(pair.buggy, s), device, dtype, shape, seeds)
    fix_att, fix_norms = fix.attention, fix.grad_norms
    bug_att, bug_norms, bug_err = bug.attention, bug.grad_norms, bug.error
    nan = float("nan")
    if bug_err:
        verdict, reason = Verdict.LOUD, f"raises: {bug_err}"
        bug_att = {k: nan for k in fix_att}
    elif degenerate(bug_att) and not degenerate(fix_att):
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
    return Measurement(
        pitfall=card.id,
        device=str(device),
        dtype=dtype_name(dtype),
        shape=shape,
        seed=seed,
        verdict=verdict,
        reason=reason,
        output=output,
        attention=pd.DataFrame([dict(run="fix", **fix_att), dict(run="bug", **bug_att)]),
        gradients=gradients,
        error=bug_err,
        weights={"fix": fix.weights, "bug": bug.weights},
        seeds=n_seeds,
    )
