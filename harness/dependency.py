"""Black-box probes on one module: what it depends on, and whether it repeats itself.

Dependency by perturbation (prefix consistency): redraw the inputs from position p on and call
the module again under the same seed; for a causal module every output before p stays exactly the
same. One forward pass per split point, without a backward pass, so the cost grows with seq_len
like a forward pass does. Every split is tried on short sequences, which pins each leak to the
latest input it reaches; on long ones ``MAX_SPLITS`` spread over the sequence, which still catches
any leak that spans one of them (an unmasked future, an inverted or shifted mask).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from harness.inputs import generator
from harness.runner import seeded, split_output

MAX_SPLITS = 8  # split points tried on long sequences
CHANGED = 1e-12  # relative change that is not rounding: the same kernels, the same rows


@dataclass(frozen=True)
class Leak:
    """An output position that changes when later inputs are redrawn."""

    query: int  # output position t
    key: int  # the latest input s > t it depends on
    change: float  # max |change| of output t when inputs from t + 1 on change (NaN: NaN there)

    def __str__(self) -> str:
        where = f"output at position {self.query} depends on input {self.key}"
        if math.isnan(self.change):
            return f"{where}: it is NaN there, no proof that it ignores them"
        return f"{where}: it moves by {self.change:.3g} when later inputs change"


def splits(seq_len: int, most: int = MAX_SPLITS) -> list[int]:
    """Split points p (inputs from p on are redrawn): all of 1..T-1 when there are at most
    ``most``, else ``most`` spread evenly, first and last included."""
    if seq_len - 1 <= most:
        return list(range(1, seq_len))
    step = (seq_len - 2) / (most - 1)
    return sorted({1 + round(i * step) for i in range(most)})


Call = Callable[[Tensor], Tensor]


def as_call(module: nn.Module, mask: Tensor | None) -> Call:
    """``x -> output`` for a module called as ``module(x)`` or ``module(x, mask)``."""

    def call(x: Tensor) -> Tensor:
        return split_output(module(x) if mask is None else module(x, mask))[0]

    return call


class Redraws:
    """Calls of a module on ``x`` with some input positions redrawn, each against the call on
    ``x`` itself (made once). Every call runs under ``seed``: a module that samples draws the
    same."""

    def __init__(self, call: Call, x: Tensor, seed: int = 0):
        self.call, self.x, self.seed = call, x, seed
        noise = torch.randn(x.shape, generator=generator(seed + 99), dtype=torch.float64)
        self.noise = (noise * x.detach().double().std()).to(x.device, x.dtype)
        self.before = self._output(x)
        self.scale = max(self.before.nan_to_num(0.0, 0.0, 0.0).abs().max().item(), 1.0)

    def _output(self, x: Tensor) -> Tensor:
        with torch.no_grad(), seeded(self.seed):
            return self.call(x).double()

    def change(self, moved: Tensor) -> Tensor:
        """(B, T): how far each output position moves when the inputs at ``moved`` (B, T) are
        redrawn, 0 below rounding; NaN where it is NaN either time: no proof that it ignores
        them."""
        redrawn = torch.where(moved[..., None].to(self.x.device), self.noise, self.x)
        before, after = self.before, self._output(redrawn)
        diff = (before - after).abs()  # NaN wherever either call is NaN
        change = diff.flatten(2).amax(-1) if diff.dim() > 2 else diff
        return change.masked_fill(change <= CHANGED * self.scale, 0.0).cpu()

    def latest(self, rows: Tensor, t: int, candidates: list[int]) -> int:
        """The latest of ``candidates`` (sorted positions; redrawing all of them in the sequences
        ``rows`` (B,) bool moves output t there) whose redraw moves it: a binary search."""
        lo, hi = 0, len(candidates) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            moved = torch.zeros(self.x.shape[:2], dtype=torch.bool)
            moved[:, candidates[mid:]] = True
            change = self.change(moved & rows[:, None])[rows, t]
            if (change.isnan() | (change > 0)).any():
                lo = mid
            else:
                hi = mid - 1
        return candidates[lo]


def future_leak(
    module: nn.Module | Call, x: Tensor, mask: Tensor | None = None, most: int = MAX_SPLITS
) -> Leak | None:
    """The earliest output position that depends on a later input, or None if there is none.

    ``module`` is called as ``module(x)`` or ``module(x, mask)`` (or is a call ``x -> output``);
    at most ``most`` split points are tried.
    """
    call = as_call(module, mask) if isinstance(module, nn.Module) else module
    redraws = Redraws(call, x)
    batch, seq_len = x.shape[:2]
    positions = torch.arange(seq_len)
    found: dict[int, tuple[int, float]] = {}  # query -> (latest split that moves it, change)
    for p in splits(seq_len, most):
        change = redraws.change((positions >= p).expand(batch, seq_len))[:, :p]  # (B, p)
        worst = torch.where(change.isnan().any(0), math.nan, change.nan_to_num(0.0).amax(0))
        for t in (worst.isnan() | (worst > 0)).nonzero().flatten().tolist():
            found[t] = (p, _worse(found.get(t, (0, 0.0))[1], worst[t].item()))
    if not found:
        return None
    t = min(found)
    every = torch.ones(batch, dtype=torch.bool)
    return Leak(t, redraws.latest(every, t, list(range(found[t][0], seq_len))), found[t][1])


def _worse(a: float, b: float) -> float:
    return math.nan if math.isnan(a) or math.isnan(b) else max(a, b)


@dataclass(frozen=True)
class Repeats:
    """Two identical calls on one input: how far apart their outputs are (0 for a deterministic
    module; NaN when an output is NaN or infinite, so that nothing can be compared), and how far
    the first call moved its own copy of the input in place (0: it left it alone)."""

    difference: float
    input_change: float


def repeat_calls(module: nn.Module, x: Tensor, mask: Tensor | None, seed: int) -> Repeats:
    """Call the module twice on the same input, each time on a copy of ``x``, so a module that
    changes its input in place is not taken for one that samples. The two calls draw from
    different seeds, so a module that samples (dropout) shows it; the global RNG is restored
    afterwards."""
    call, outputs, given = as_call(module, mask), [], [x.clone(), x.clone()]
    with torch.no_grad():
        for s, copy in zip((seed, seed + 1), given, strict=True):
            with seeded(s):
                outputs.append(call(copy).double())
    moved = (given[0].double() - x.double()).abs()
    change = float(moved.nan_to_num(math.inf).max()) if moved.numel() else 0.0
    if not all(bool(torch.isfinite(out).all()) for out in outputs):
        return Repeats(math.nan, change)
    diff = (outputs[0] - outputs[1]).abs()
    return Repeats(float(diff.max()) if diff.numel() else 0.0, change)


def repeat_difference(module: nn.Module, x: Tensor, mask: Tensor | None, seed: int) -> float:
    """``repeat_calls``' difference alone."""
    return repeat_calls(module, x, mask, seed).difference
