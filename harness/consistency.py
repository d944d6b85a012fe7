"""Does a module give the same answer however generation calls it?

The full forward in float64 is the reference; the floor is the full forward's own error in the
dtype. A cached scenario (prefill then one-token steps, chunked prefill, a reused cache) must
stay within FlashAttention's rule of that floor: the cache is bookkeeping, not arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from harness import metrics
from harness.masks import MaskSpec
from harness.runner import as_dtype, exact_float32, run, seeded
from harness.scenarios import SCENARIOS, Invoke, contract_invoke, make_call

CACHED = ("decode", "chunked", "reuse")  # the scenarios that go through a cache


@dataclass(frozen=True)
class Agreement:
    """One scenario's output against the full forward in float64."""

    scenario: str
    error: metrics.Error  # the scenario in the dtype vs the full forward in float64
    floor: metrics.Error  # the full forward in the dtype vs the same
    threshold: float
    steps: Tensor | None  # (T,) max |error| per position, for a per-step picture
    failure: str | None = None  # the exception the scenario raised, if any
    refused: bool = False  # NotImplementedError: the module or its caller takes no such calls

    @property
    def agrees(self) -> bool:
        return self.failure is None and self.error.finite and self.error.max_abs <= self.threshold

    def __str__(self) -> str:
        if self.failure:
            return f"{self.scenario}: raises {self.failure}"
        return (
            f"{self.scenario}: max error {self.error.max_abs:.3g} vs full forward "
            f"(threshold {self.threshold:.3g})"
        )


def position_errors(out: Tensor | None, ref: Tensor) -> Tensor | None:
    """(T,) the largest |out - ref| at each position of (B, T, d) outputs; None when ``out`` is
    missing or of another shape."""
    if out is None or out.shape != ref.shape:
        return None
    return (out - ref).abs().amax(dim=(0, 2))


def at_least_one_ulp(floor: metrics.Error, ref: Tensor, dtype: torch.dtype) -> metrics.Error:
    """``floor``, but never below one unit in the last place of the output's largest value in
    ``dtype``: the floor here is the same module's full forward, which on a small input may
    round almost exactly, and a cached call that sums in another order may then be 2 ulps off
    with nothing wrong (seen: 1.6e-07 against a threshold of 1.45e-07 at B=2 T=2 d=4)."""
    one_ulp = metrics.one_ulp(ref, dtype)
    return floor if floor.max_abs >= one_ulp else metrics.Error(one_ulp, floor.rel_l2)


def agreements(
    module: nn.Module,
    new_cache: Callable[[], object] | None,
    x: Tensor,
    keep: Tensor | None,
    spec: MaskSpec | None,
    positions: Tensor | None,
    device: torch.device,
    dtype: torch.dtype,
    scenarios: tuple[str, ...] = CACHED,
    seed: int = 0,
    invoke: Invoke = contract_invoke,
    ref_dtype: torch.dtype = torch.float64,
) -> list[Agreement]:
    """Each of ``scenarios`` against the full forward, for ``module`` in ``dtype``.

    ``x`` (float64), ``keep`` and ``positions`` are on the CPU; the module is copied, never
    changed; ``invoke`` makes each call (default: the extended contract). The reference is the
    full forward in ``ref_dtype``. Nothing here needs a backward pass.
    """

    def output(scenario: str, in_dtype: torch.dtype):
        call = make_call(SCENARIOS[scenario], keep, spec, positions, new_cache, invoke)
        with exact_float32(device), seeded(seed), torch.no_grad():
            return run(as_dtype(module, device, in_dtype), x.to(device, in_dtype), None, None, call)

    ref = output("full", ref_dtype)
    if not ref.ok:
        raise ValueError(f"the full forward fails: {ref.error}")
    full = output("full", dtype)
    floor = at_least_one_ulp(metrics.error(full.output, ref.output), ref.output, dtype)
    tol = metrics.atol(ref.output, dtype)
    limit = metrics.threshold(floor, tol, metrics.OUTPUT_FACTOR)
    found = []
    for scenario in scenarios:
        got = output(scenario, dtype)
        if not got.ok:
            nan = metrics.Error(float("nan"), float("nan"))
            found.append(Agreement(scenario, nan, floor, limit, None, got.error, got.refused))
            continue
        steps = position_errors(got.output, ref.output)
        err = metrics.error(got.output, ref.output)
        found.append(Agreement(scenario, err, floor, limit, steps))
    return found
