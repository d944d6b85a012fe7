"""Measure a buggy/fixed pair: three runs, errors against the floor, statistics, a verdict.

For each (pitfall, device, dtype, shape, seed): ``ref`` is the fixed module in float64, ``fix`` the
fixed module in the dtype and ``bug`` the buggy module in the dtype, all with the same weights
(unless the card says the bug *is* the weights), the same inputs and the same upstream gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd
import torch
from torch import Tensor, nn

from harness import metrics
from harness.inputs import convert_mask, make_inputs, upstream_gradient
from harness.runner import INPUT_GRAD, Run, as_dtype, exact_float32, run, seeded
from harness.shapes import Shape
from harness.verdicts import Verdict

if TYPE_CHECKING:
    from pitfalls import Pair


class MeasurementError(RuntimeError):
    """The measurement itself is invalid (for example the fixed module fails)."""


@dataclass
class Comparison:
    """ref/fix/bug runs of one pair on one shape, with the tables derived from them."""

    output: pd.DataFrame  # one row per run (fix, bug): error vs ref, threshold, differs
    attention: pd.DataFrame  # one row per run (fix, bug): entropy, saturation, NaN rows, row sums
    gradients: pd.DataFrame  # one row per parameter (and the input): norms, cosine, errors
    fix: Run
    bug: Run

    @property
    def diverges(self) -> bool:
        """Output or any gradient of ``bug`` beyond the floor (or not comparable at all)."""
        return bool(self.output["differs"].any() or self.gradients["differs"].eq(True).any())


@dataclass
class Measurement:
    """The measured behaviour of one trap on one device and dtype."""

    pitfall: str
    device: str
    dtype: str
    shape: Shape
    seed: int
    verdict: Verdict
    reason: str  # one line: why this verdict
    output: pd.DataFrame
    attention: pd.DataFrame
    gradients: pd.DataFrame
    error: str | None = None  # the bug's exception, if it raised
    warnings: list[str] = field(default_factory=list)
    trigger: Shape | None = None  # smallest shape on which a CONDITIONAL bug runs silently
    weights: dict[str, Tensor | None] = field(default_factory=dict)  # fix/bug attention

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
            err_bug=out.loc["bug", "max_abs"] if "max_abs" in out else float("nan"),
            floor=out.loc["fix", "max_abs"] if "max_abs" in out else float("nan"),
            threshold=out.loc["bug", "threshold"] if "threshold" in out else float("nan"),
            entropy_fix=att.loc["fix", "entropy_mean"],
            entropy_bug=att.loc["bug", "entropy_mean"],
            grad_cosine_min=cos.min() if len(cos) else float("nan"),
            trigger=self.trigger.label() if self.trigger else "",
            error=self.error or "",
            reason=self.reason,
        )


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def build_pair(pair: Pair, shape: Shape, seed: int) -> tuple[nn.Module, nn.Module]:
    """Fixed and buggy modules for ``shape``, initialised from ``seed``.

    With shared weights the buggy module gets the fixed module's weights (through the card's
    ``to_buggy`` map where the bug changes the parameters). The global RNG is left untouched.
    """
    card = pair.card
    with seeded(seed):
        fixed = card.build(pair.fixed, shape)
    with seeded(seed):
        buggy = card.build(pair.buggy, shape)
    if card.shared_weights:
        state = fixed.state_dict()
        buggy.load_state_dict(card.to_buggy(state, shape) if card.to_buggy else state)
    return fixed.eval(), buggy.eval()


def _output_table(ref: Run, fix: Run, bug: Run, dtype: torch.dtype) -> pd.DataFrame:
    tol = metrics.atol(ref.output, dtype)
    floor = metrics.error(fix.output, ref.output)
    rows = []
    for name, r in (("fix", fix), ("bug", bug)):
        err = metrics.error(r.output, ref.output) if r.ok else metrics.INFINITE
        rows.append(
            dict(
                run=name,
                max_abs=err.max_abs,
                rel_l2=err.rel_l2,
                floor=floor.max_abs,
                atol=tol,
                threshold=metrics.threshold(floor, tol, metrics.OUTPUT_FACTOR),
                differs=metrics.differs(err, floor, tol, metrics.OUTPUT_FACTOR) if r.ok else True,
                shape=tuple(r.output.shape) if r.output is not None else None,
            )
        )
    return pd.DataFrame(rows)


def _attention_table(fix: Run, bug: Run, keep: Tensor | None) -> pd.DataFrame:
    rows = [
        dict(run=n, **metrics.attention_stats(r.weights, keep))
        for n, r in (("fix", fix), ("bug", bug))
    ]
    return pd.DataFrame(rows)


def _gradient_table(
    pair: Pair, shape: Shape, ref: Run, fix: Run, bug: Run, dtype: torch.dtype
) -> pd.DataFrame:
    card = pair.card
    bug_grads = card.to_fixed(bug.grads, shape) if card.to_fixed and bug.grads else bug.grads
    rows = []
    for name in [*ref.grads, *(n for n in bug_grads if n not in ref.grads)]:
        ref_g, fix_g, bug_g = ref.grads.get(name), fix.grads.get(name), bug_grads.get(name)
        fs, bs = metrics.grad_stats(fix_g), metrics.grad_stats(bug_g)
        row = dict(
            param=name,
            norm_fix=fs["norm"],
            norm_bug=bs["norm"],
            ratio=bs["norm"] / fs["norm"] if fs["norm"] else float("nan"),
            cosine=metrics.cosine(bug_g, fix_g)
            if bug_g is not None and fix_g is not None
            else float("nan"),
            zero_frac_fix=fs["zero_frac"],
            zero_frac_bug=bs["zero_frac"],
            nonfinite_bug=bs["nonfinite"],
            err_fix=float("nan"),
            err_bug=float("nan"),
            threshold=float("nan"),
            differs=None,
        )
        if ref_g is not None and fix_g is not None:
            tol = metrics.atol(ref_g, dtype)
            floor = metrics.error(fix_g, ref_g)
            err = metrics.error(bug_g, ref_g)
            row.update(
                err_fix=floor.max_abs,
                err_bug=err.max_abs,
                threshold=metrics.threshold(floor, tol, metrics.GRAD_FACTOR),
                differs=metrics.differs(err, floor, tol, metrics.GRAD_FACTOR),
            )
        rows.append(row)
    return pd.DataFrame(rows)


def compare(
    pair: Pair, device: torch.device, dtype: torch.dtype, shape: Shape, seed: int = 0
) -> Comparison:
    """Run ref, fix and bug once on ``shape`` and tabulate how they differ."""
    card = pair.card
    inputs = make_inputs(shape, seed, card.mask, card.input_scale)
    fixed, buggy = build_pair(pair, shape, seed)
    with exact_float32(device):
        ref = run(
            as_dtype(fixed, device, torch.float64),
            inputs.x.to(device),
            convert_mask(inputs.keep, card.convention, device, torch.float64),
            lambda out_shape: upstream_gradient(out_shape, seed),
        )
        if not ref.ok:
            raise MeasurementError(f"{card.id}: the fixed module fails in float64: {ref.error}")
        G = upstream_gradient(ref.output.shape, seed)
        x = inputs.x.to(device, dtype)
        mask = convert_mask(inputs.keep, card.convention, device, dtype)
        fix = run(as_dtype(fixed, device, dtype), x, mask, G)
        if not fix.ok:
            raise MeasurementError(
                f"{card.id}: the fixed module fails in {dtype_name(dtype)}: {fix.error}"
            )
        bug = run(as_dtype(buggy, device, dtype), x, mask, G)
    return Comparison(
        output=_output_table(ref, fix, bug, dtype),
        attention=_attention_table(fix, bug, inputs.keep),
        gradients=_gradient_table(pair, shape, ref, fix, bug, dtype),
        fix=fix,
        bug=bug,
    )


def runs_silently(pair: Pair, device: torch.device, dtype: torch.dtype, shape: Shape) -> bool:
    """True when the bug runs on ``shape`` without error and diverges beyond the floor."""
    _, buggy = build_pair(pair, shape, 0)
    inputs = make_inputs(shape, 0, pair.card.mask, pair.card.input_scale)
    mask = convert_mask(inputs.keep, pair.card.convention, device, dtype)
    with exact_float32(device):
        if not run(as_dtype(buggy, device, dtype), inputs.x.to(device, dtype), mask, None).ok:
            return False  # cheap early exit: most shapes raise
    return compare(pair, device, dtype, shape).diverges


def measure(
    pair: Pair,
    device: torch.device,
    dtype: torch.dtype,
    seed: int = 0,
    shape: Shape | None = None,
    search: bool = True,
) -> Measurement:
    """Measure one trap on one device and dtype and give it a verdict.

    A bug that raises on the measurement shape is searched for trigger shapes (when ``search``):
    if some shape lets it run and diverge, the verdict is CONDITIONAL with the smallest such shape.
    """
    if not pair.card.shared_weights:
        from harness.seeds import measure_over_seeds

        return measure_over_seeds(pair, device, dtype, seed=seed, shape=shape)
    shape = shape or pair.card.shape
    cmp = compare(pair, device, dtype, shape, seed)
    trigger = None
    if not cmp.bug.ok:
        from harness.search import find_trigger

        trigger = find_trigger(pair, device, dtype) if search else None
        if trigger is not None:
            verdict = Verdict.CONDITIONAL
            reason = f"raises on {shape.label()}; runs silently on {trigger.label()}"
        else:
            verdict, reason = Verdict.LOUD, f"raises: {cmp.bug.error}"
    elif cmp.diverges:
        verdict, reason = Verdict.SILENT, _divergence_reason(cmp)
    else:
        verdict, reason = Verdict.BENIGN, "output and every gradient within the noise floor"
    return Measurement(
        pitfall=pair.card.id,
        device=str(device),
        dtype=dtype_name(dtype),
        shape=shape,
        seed=seed,
        verdict=verdict,
        reason=reason,
        output=cmp.output,
        attention=cmp.attention,
        gradients=cmp.gradients,
        error=cmp.bug.error,
        warnings=cmp.bug.warnings,
        trigger=trigger,
        weights={"fix": cmp.fix.weights, "bug": cmp.bug.weights},
    )


def _divergence_reason(cmp: Comparison) -> str:
    bug = cmp.output.set_index("run").loc["bug"]
    if bug["shape"] != cmp.output.set_index("run").loc["fix", "shape"]:
        return f"output shape {bug['shape']} instead of {cmp.output.iloc[0]['shape']}"
    if bug["differs"]:
        return f"output error {bug['max_abs']:.3g} > threshold {bug['threshold']:.3g}"
    worst = cmp.gradients[cmp.gradients["differs"].eq(True)].iloc[0]
    return f"gradient of {worst['param']}: error {worst['err_bug']:.3g} > {worst['threshold']:.3g}"
