"""Where cached calls first compute something the full forward does not.

The full forward and a cached scenario are recorded op by op, in float64, on the same weights
and prompt. An op of a cached call fed positions ``s .. s + m - 1`` (``S = s + m`` keys so far)
is matched with the op of the full forward that ran on the same line, the same op, as many
times before it; their results are compared where they overlap: an axis the full forward has
``T`` long is the queries' (``m`` long: positions ``s .. s + m - 1``) or the keys' (``S``
long: ``0 .. S - 1``), and other axes are compared whole. The first op whose result differs is
where the cached calls go wrong; when it computes there what the full forward computes for
the first ``m`` positions, the positions restart at 0 on each call (``rope_cache_offset``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from harness.doctor.reading.record import Op, Record, Recorder, forwards, known_tensors

RTOL, ATOL = 1e-5, 1e-6  # float64 both ways, but a module may round through float32 itself


@dataclass
class Recorded:
    """One call of a scenario: its first position, tokens fed, whether through a cache."""

    start: int
    fed: int
    cached: bool
    record: Record


def recording_all(invoke: Callable[..., object], calls: list[Recorded]) -> Callable[..., object]:
    """``invoke``, every call (the full forward's too) recorded into ``calls``."""

    def call(module: nn.Module, xs: Tensor, mask, positions, cache, start: int) -> object:
        recorder = Recorder(known_tensors(module), {}, forwards(module))
        try:
            with recorder:
                return invoke(module, xs, mask, positions, cache, start)
        finally:
            calls.append(Recorded(start, xs.shape[1], cache is not None, recorder.record))

    return call


def _keyed(record: Record) -> dict[tuple[str, str, int], Op]:
    """The ops of the user's code by (line, op, how many times it ran there before)."""
    seen: dict[tuple[str, str], int] = {}
    keyed = {}
    for op in record.ops:
        if not op.line or not op.shapes:
            continue
        n = seen.get((op.line, op.name), 0)
        seen[(op.line, op.name)] = n + 1
        keyed[(op.line, op.name, n)] = op
    return keyed


def _window(cached: Tensor, full: Tensor, start: int, fed: int, first: bool) -> Tensor | None:
    """The part of ``full`` (the full forward's result, ``T`` long on its positions' axes) that
    ``cached`` (a call fed ``start .. start + fed - 1``) computes; with ``first``, the part for
    the first ``fed`` positions instead of the fed ones. None where the shapes do not say which
    part, or no axis is a positions' axis (a whole table, a constant)."""
    if cached.dim() != full.dim() or cached.dim() == 0:
        return None
    seen, cut = start + fed, []
    for have, whole in zip(cached.shape, full.shape, strict=True):
        if have == whole:
            cut.append(slice(None))
        elif have == fed:
            cut.append(slice(0, fed) if first else slice(start, seen))
        elif have == seen:
            cut.append(slice(0, seen))
        else:
            return None
    if all(c == slice(None) for c in cut):
        return None
    return full[tuple(cut)]


def _same(a: Tensor, b: Tensor) -> bool:
    if a.shape != b.shape:
        return False
    if not (a.is_floating_point() and b.is_floating_point()):
        return bool(torch.equal(a, b.to(a.dtype)))
    a, b = a.double(), b.double()
    scale = float(b[b.isfinite()].abs().max()) if bool(b.isfinite().any()) else 1.0
    return bool(torch.allclose(a, b, rtol=RTOL, atol=ATOL * max(scale, 1.0), equal_nan=True))


@dataclass(frozen=True)
class Divergence:
    """The first op of a cached call (``start``, ``fed``) whose result is not the full
    forward's; ``restarts``: what it computed is the full forward's for positions from 0."""

    op: Op
    start: int
    fed: int
    restarts: bool


def first_divergence(calls: list[Recorded]) -> Divergence | None:
    """The first op, over the cached calls in order, that computes other than the full
    forward (the first uncached call recorded) where both cover the same positions."""
    full = next((c for c in calls if not c.cached), None)
    if full is None:
        return None
    reference = _keyed(full.record)
    for call in (c for c in calls if c.cached):
        for key, op in _keyed(call.record).items():
            twin = reference.get(key)
            if twin is None or not call.record.results[op.index]:
                continue
            mine, theirs = call.record.results[op.index][0], full.record.results[twin.index][0]
            window = _window(mine, theirs, call.start, call.fed, first=False)
            if window is None or _same(mine, window):
                continue
            restart = _window(mine, theirs, call.start, call.fed, first=True)
            restarts = call.start > 0 and restart is not None and _same(mine, restart)
            return Divergence(op, call.start, call.fed, restarts)
    return None
