"""Compare a buggy/fixed pair: three runs, errors against the floor, statistics.

For each (pitfall, device, dtype, shape, seed): ``ref`` is the fixed module in float64, ``fix`` the
fixed module in the dtype and ``bug`` the buggy module in the dtype, all with the same weights
(unless the card says the bug *is* the weights), the same inputs and the same upstream gradient.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import pandas as pd
import torch
from torch import Tensor, nn

from harness import metrics
from harness.catalogue.card import Pair
from harness.dependency import future_leak, repeat_difference
from harness.devices import dtype_name
from harness.inputs import Inputs, upstream_gradient
from harness.masks import CAUSAL_KINDS, encode
from harness.runner import Run, as_dtype, describe, exact_float32, run, seeded
from harness.scenarios import Call, make_call
from harness.shapes import Shape

# What the repeat-call probe says when an output is NaN or infinite: not a difference.
NOT_FINITE = "not finite (NaN or inf): cannot be compared"
REPEATS = "two identical calls in eval"  # the repeat-call probe's name


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
    probes: dict[str, str] = field(default_factory=dict)  # what each probe says of both modules
    bug_findings: dict[str, str] = field(default_factory=dict)  # what a probe found in buggy.py
    ref: Run | None = None  # the fixed module in float64 (its output is what fix and bug chase)
    keep: Tensor | None = None  # the inputs' allowed keys (B, T, T), as measured

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


def scenario_call(pair: Pair, side: str, inputs: Inputs) -> Call | None:
    """How ``fixed`` or ``buggy`` is called on ``inputs``: a modern pair through its card's
    scenario (with that file's own KVCache), a classic pair as ``module(x[, mask])`` (None)."""
    card = pair.card
    if not card.modern:
        return None
    module = pair.fixed if side == "fixed" else pair.buggy
    new_cache = getattr(module, "KVCache", None)
    return make_call(card.how, inputs.keep, card.spec, inputs.positions, new_cache)


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
) -> tuple[dict[str, str], dict[str, str]]:
    """Causal leak (for causal traps) and repeat calls in eval mode, fixed.py then buggy.py:
    what each probe says of both, and what it found in buggy.py (a leak, calls that differ;
    a probe that found nothing there, or could not tell, is absent)."""
    said: dict[str, list[str]] = {}
    found: dict[str, str] = {}
    for name, module in (("fixed.py", fix), ("buggy.py", bug)):
        try:
            with warnings.catch_warnings():  # run() has recorded them already
                warnings.simplefilter("ignore")
                if pair.card.mask in CAUSAL_KINDS:
                    leak = future_leak(module, x, mask)
                    said.setdefault("future leak", []).append(f"{name} {leak or 'none'}")
                    if module is bug and leak is not None:
                        found["future leak"] = str(leak)
                diff = repeat_difference(module, x, mask, seed)
            text = "identical" if diff == 0 else f"differ by up to {diff:.3g}"
            text = NOT_FINITE if math.isnan(diff) else text
            said.setdefault(REPEATS, []).append(f"{name} {text}")
            if module is bug and diff != 0 and not math.isnan(diff):  # NaN: cannot be compared
                found[REPEATS] = text
        except Exception as exc:  # a raising module is reported, not probed
            said.setdefault("probes", []).append(f"{name} raises: {describe(exc)}")
    return {probe: "; ".join(texts) for probe, texts in said.items()}, found


def compare(
    pair: Pair,
    device: torch.device,
    dtype: torch.dtype,
    shape: Shape,
    seed: int = 0,
    edge: bool = False,
    probes: bool = False,
    backward: bool = True,
) -> Comparison:
    """Run ref, fix and bug once on ``shape`` and tabulate how they differ.

    ``edge`` draws the card's edge inputs instead of the ordinary ones; ``probes`` adds the
    causal-leak and repeat-call probes; without ``backward`` only the forwards run (the output
    table alone is filled: the gradient table is empty). Every run happens under
    ``seeded(seed)``, so modules that sample (dropout) are reproducible and the global RNG is
    left alone.
    """
    card = pair.card
    inputs = card.inputs(shape, seed, edge)
    fixed, buggy = build_pair(pair, shape, seed)
    fix_call, bug_call = scenario_call(pair, "fixed", inputs), scenario_call(pair, "buggy", inputs)
    with exact_float32(device):
        with seeded(seed):
            ref = run(
                as_dtype(fixed, device, torch.float64),
                inputs.x.to(device),
                encode(inputs.keep, card.spec, device, torch.float64),
                (lambda out_shape: upstream_gradient(out_shape, seed)) if backward else None,
                fix_call,
            )
        if not ref.ok:
            raise MeasurementError(f"{card.id}: the fixed module fails in float64: {ref.error}")
        G = upstream_gradient(ref.output.shape, seed) if backward else None
        x = inputs.x.to(device, dtype)
        mask = encode(inputs.keep, card.spec, device, dtype)
        fix_module, bug_module = as_dtype(fixed, device, dtype), as_dtype(buggy, device, dtype)
        with seeded(seed):
            fix = run(fix_module, x, mask, G, fix_call)
        if not fix.ok:
            raise MeasurementError(
                f"{card.id}: the fixed module fails in {dtype_name(dtype)}: {fix.error}"
            )
        with seeded(seed):
            bug = run(bug_module, x, mask, G, bug_call)
        said, found = (
            _module_probes(pair, fix_module, bug_module, x, mask, seed) if probes else ({}, {})
        )
    return Comparison(
        output=_output_table(ref, fix, bug, dtype),
        attention=_attention_table(fix, bug, inputs.keep),
        gradients=_gradient_table(pair, shape, ref, fix, bug, dtype),
        fix=fix,
        bug=bug,
        shape=shape,
        seed=seed,
        edge=edge,
        probes=said,
        bug_findings=found,
        ref=ref,
        keep=inputs.keep,
    )


def runs_silently(pair: Pair, device: torch.device, dtype: torch.dtype, shape: Shape) -> bool:
    """True when the bug runs on ``shape`` without error and diverges beyond the floor."""
    _, buggy = build_pair(pair, shape, 0)
    inputs = pair.card.inputs(shape, 0)
    mask = encode(inputs.keep, pair.card.spec, device, dtype)
    call = scenario_call(pair, "buggy", inputs)
    with exact_float32(device), seeded(0):
        x = inputs.x.to(device, dtype)
        if not run(as_dtype(buggy, device, dtype), x, mask, None, call).ok:
            return False  # cheap early exit: most shapes raise
    cmp = compare(pair, device, dtype, shape)
    return cmp.bug.ok and cmp.diverges
