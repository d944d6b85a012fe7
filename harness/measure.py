"""Measure a buggy/fixed pair: three runs, errors against the floor, statistics, a verdict.

For each (pitfall, device, dtype, shape, seed): ``ref`` is the fixed module in float64, ``fix`` the
fixed module in the dtype and ``bug`` the buggy module in the dtype, all with the same weights
(unless the card says the bug *is* the weights), the same inputs and the same upstream gradient.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd
import torch
from torch import Tensor, nn

from harness import metrics
from harness.inputs import convert_mask, upstream_gradient
from harness.probes import future_leak, repeat_difference
from harness.runner import INPUT_GRAD, Run, as_dtype, describe, exact_float32, run, seeded
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
    shape: Shape
    seed: int
    edge: bool = False  # measured on the card's edge inputs
    probes: dict[str, str] = field(default_factory=dict)

    @property
    def diverges(self) -> bool:
        """The bug raised, or its output or a gradient is beyond the floor."""
        return bool(
            not self.bug.ok
            or self.output["differs"].eq(True).any()
            or self.gradients["differs"].eq(True).any()
        )

    @property
    def nonfinite(self) -> bool:
        """The bug produced NaN or Inf (output or gradient) where the fixed module did not."""
        return self.bug.first_nonfinite is not None and self.fix.first_nonfinite is None


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
    edge: bool = False  # the tables come from the card's edge inputs
    probes: dict[str, str] = field(default_factory=dict)  # causal leak, repeat calls
    variants: dict[str, str] = field(default_factory=dict)  # e.g. the verdict with one head
    seeds: int = 0  # > 0: compared over this many seeds instead of shared weights

    @property
    def raised(self) -> bool:
        """The tables hold no buggy run: it raised (LOUD, or NUMERIC by an error)."""
        return self.output.set_index("run").loc["bug", "differs"] is None

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
    nan = float("nan")
    for name, r in (("fix", fix), ("bug", bug)):
        err = metrics.error(r.output, ref.output) if r.ok else metrics.Error(nan, nan)
        rows.append(
            dict(
                run=name,
                max_abs=err.max_abs,
                rel_l2=err.rel_l2,
                floor=floor.max_abs,
                atol=tol,
                threshold=metrics.threshold(floor, tol, metrics.OUTPUT_FACTOR),
                differs=metrics.differs(err, floor, tol, metrics.OUTPUT_FACTOR) if r.ok else None,
                shape=tuple(r.output.shape) if r.ok and r.output is not None else None,
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


def _module_probes(
    pair: Pair, fix: nn.Module, bug: nn.Module, x: Tensor, mask: Tensor | None, seed: int
) -> dict[str, str]:
    """Causal leak (for causal traps) and repeat calls in eval mode, fixed.py then buggy.py."""
    found: dict[str, list[str]] = {}
    for name, module in (("fixed.py", fix), ("buggy.py", bug)):
        try:
            with warnings.catch_warnings():  # run() has recorded them already
                warnings.simplefilter("ignore")
                if pair.card.mask in ("causal", "both"):
                    leak = future_leak(module, x, mask)
                    found.setdefault("future leak", []).append(f"{name} {leak or 'none'}")
                diff = repeat_difference(module, x, mask, seed)
            text = "identical" if diff == 0 else f"differ by up to {diff:.3g}"
            found.setdefault("two identical calls in eval", []).append(f"{name} {text}")
        except Exception as exc:  # a raising module is reported, not probed
            found.setdefault("probes", []).append(f"{name} raises: {describe(exc)}")
    return {probe: "; ".join(texts) for probe, texts in found.items()}


def compare(
    pair: Pair,
    device: torch.device,
    dtype: torch.dtype,
    shape: Shape,
    seed: int = 0,
    edge: bool = False,
    probes: bool = False,
) -> Comparison:
    """Run ref, fix and bug once on ``shape`` and tabulate how they differ.

    ``edge`` draws the card's edge inputs instead of the ordinary ones; ``probes`` adds the
    causal-leak and repeat-call probes. Every run happens under ``seeded(seed)``, so modules
    that sample (dropout) are reproducible and the global RNG is left alone.
    """
    card = pair.card
    inputs = card.inputs(shape, seed, edge)
    fixed, buggy = build_pair(pair, shape, seed)
    with exact_float32(device):
        with seeded(seed):
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
        fix_module, bug_module = as_dtype(fixed, device, dtype), as_dtype(buggy, device, dtype)
        with seeded(seed):
            fix = run(fix_module, x, mask, G)
        if not fix.ok:
            raise MeasurementError(
                f"{card.id}: the fixed module fails in {dtype_name(dtype)}: {fix.error}"
            )
        with seeded(seed):
            bug = run(bug_module, x, mask, G)
        found = _module_probes(pair, fix_module, bug_module, x, mask, seed) if probes else {}
    return Comparison(
        output=_output_table(ref, fix, bug, dtype),
        attention=_attention_table(fix, bug, inputs.keep),
        gradients=_gradient_table(pair, shape, ref, fix, bug, dtype),
        fix=fix,
        bug=bug,
        shape=shape,
        seed=seed,
        edge=edge,
        probes=found,
    )


def runs_silently(pair: Pair, device: torch.device, dtype: torch.dtype, shape: Shape) -> bool:
    """True when the bug runs on ``shape`` without error and diverges beyond the floor."""
    _, buggy = build_pair(pair, shape, 0)
    inputs = pair.card.inputs(shape, 0)
    mask = convert_mask(inputs.keep, pair.card.convention, device, dtype)
    with exact_float32(device), seeded(0):
        if not run(as_dtype(buggy, device, dtype), inputs.x.to(device, dtype), mask, None).ok:
            return False  # cheap early exit: most shapes raise
    cmp = compare(pair, device, dtype, shape)
    return cmp.bug.ok and cmp.diverges


EDGE_NAMES = {"empty_row": "an all-padding sequence", "large": "large activations"}


def _judge(pair: Pair, device: torch.device, dtype: torch.dtype, cmp: Comparison, search: bool):
    """(verdict, reason, comparison to tabulate, trigger) for one ordinary comparison."""
    card = pair.card
    if not cmp.bug.ok:
        from harness.search import find_trigger

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
        edge = compare(pair, device, dtype, cmp.shape, cmp.seed, edge=True)
    except MeasurementError as exc:
        reason = f"within the floor on ordinary inputs; {edge_name} not measurable here: {exc}"
        return Verdict.BENIGN, reason, cmp, None
    if edge.fix.first_nonfinite is not None:  # out of the dtype's range for any module
        reason = (
            f"within the floor on ordinary inputs; with {edge_name} even fixed.py is non-finite "
            f"here ({edge.fix.first_nonfinite}), so that case tells nothing in this dtype"
        )
        return Verdict.BENIGN, reason, cmp, None
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
        from harness.seeds import measure_over_seeds

        return measure_over_seeds(pair, device, dtype, seed=seed, shape=shape)
    shape = shape or pair.card.shape
    cmp = compare(pair, device, dtype, shape, seed, probes=True)
    verdict, reason, shown, trigger = _judge(pair, device, dtype, cmp, search)
    variants = {}
    if pair.card.has_heads and shape.heads > 1:
        one = shape.with_(heads=1, d_k=shape.d_model, d_v=shape.d_model)
        single = compare(pair, device, dtype, one, seed)
        one_verdict, one_reason, _, _ = _judge(pair, device, dtype, single, search=False)
        variants["1 head"] = f"{one_verdict}: {one_reason}"
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
        edge=shown.edge,
        probes=cmp.probes,
        variants=variants,
    )


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
