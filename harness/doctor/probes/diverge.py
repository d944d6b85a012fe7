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
from functools import cached_property

import torch
from torch import Tensor, nn

from harness.doctor.reading.record import Op, Record, Recorder, forwards, known_tensors

RTOL, ATOL = 1e-5, 1e-6  # float64 both ways, but a module may round through float32 itself


@dataclass
class Recorded:
    """One call of a scenario: its first position, tokens fed, whether through a cache, and
    the ops whose results reach what it returned."""

    start: int
    fed: int
    cached: bool
    record: Record
    feeds: set[int]

    @cached_property
    def keys(self) -> dict[int, tuple[str, str, int]]:
        """Each op's key (line, op, times run there before), by its index, made once."""
        return {op.index: key for key, op in _keyed(self.record).items()}


def _feeding(record: Record, made: dict[int, tuple[int, int]], out: object) -> set[int]:
    """The ops of ``record`` whose results the returned value is computed from (a check the
    caller makes on the side, whose result goes nowhere, is not among them)."""
    first = out[0] if isinstance(out, tuple | list) and out else out
    found = made.get(id(first)) if isinstance(first, Tensor) else None
    return record.ancestors(found[0]) if found else set()


def recording_all(invoke: Callable[..., object], calls: list[Recorded]) -> Callable[..., object]:
    """``invoke``, every call (the full forward's too) recorded into ``calls``."""

    def call(module: nn.Module, xs: Tensor, mask, positions, cache, start: int) -> object:
        recorder = Recorder(known_tensors(module), {}, forwards(module))
        out = None
        try:
            with recorder:
                out = invoke(module, xs, mask, positions, cache, start)
            return out
        finally:
            feeds = _feeding(recorder.record, recorder.made, out)
            calls.append(Recorded(start, xs.shape[1], cache is not None, recorder.record, feeds))

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
    forward's; ``restarts``: what it computed is the full forward's for positions from 0;
    ``through``: the op that only cached calls run (a cat with the past keys, a write into
    the cache) which made the operand it reads wrong, where one did."""

    op: Op
    start: int
    fed: int
    restarts: bool
    through: Op | None = None


# Ops that assemble the keys and values a cached call reads: joined to the past ones, written
# into the cache's slots, read back from them
ASSEMBLE = frozenset({
    "cat", "concat", "concatenate", "stack", "__setitem__", "index_copy_", "index_copy",
    "copy_", "index_put_", "__getitem__", "narrow", "roll",
})  # fmt: skip


def _through_cache(call: Recorded, op: Op, full: Recorded, reference: dict) -> Op | None:
    """The op only cached calls run that made a wrong operand of ``op``: back from each
    operand holding every key so far that differs from the full forward's there, through
    ops the full forward runs too, to the first one it does not."""
    twin = reference.get(_key_of(call, op))
    theirs = twin.tensors if twin is not None else []
    for i, value in enumerate(op.tensors):
        mine = call.record.result(value)
        other = full.record.result(theirs[i]) if i < len(theirs) else None
        if mine is None or other is None or not _every_key(mine, other, call):
            continue
        window = _window(mine, other, call.start, call.fed, first=False)
        if window is None or _same(mine, window):
            continue  # this operand is right, or cannot be told
        seen, current = 0, call.record.producer(value)
        while current is not None and seen < 32:
            seen += 1
            if reference.get(_key_of(call, current)) is None:  # the cached path's own op
                root = _first_own(call, current, reference)
                return root if root.name in ASSEMBLE and root.line else None
            if _agrees(call, current, full, reference):
                break  # this operand is right
            inputs = [v for v in current.tensors if v.kind == "op"]
            current = call.record.producer(inputs[0]) if len(inputs) == 1 else None
    return None


def _agrees(call: Recorded, op: Op, full: Recorded, reference: dict) -> bool | None:
    """Whether ``op`` of a cached call computes what the full forward's op on its line does,
    where they overlap (None: no such op, or nothing to compare)."""
    twin = reference.get(_key_of(call, op))
    if twin is None or op.index not in call.feeds or not call.record.results[op.index]:
        return None
    mine, theirs = call.record.results[op.index][0], full.record.results[twin.index][0]
    window = _window(mine, theirs, call.start, call.fed, first=False)
    return None if window is None else _same(mine, window)


def _key_of(call: Recorded, op: Op) -> tuple[str, str, int] | None:
    return call.keys.get(op.index)


def _undone(call: Recorded, op: Op, full: Recorded, reference: dict) -> bool:
    """A later op that reads ``op``'s result agrees with the full forward again: the
    difference was a local index that the next op puts back (``arange(t) + past``)."""
    readers = [o for o in call.record.consumers(op.index) if o.index in call.feeds]
    return any(_agrees(call, reader, full, reference) for reader in readers)


def _every_key(mine: Tensor, full: Tensor, call: Recorded) -> bool:
    """An operand that holds every key so far: ``start + fed`` long on an axis the full
    forward has ``T`` long, in a call after the first (one as long as the tokens fed is
    not the keys a cache hands back)."""
    seen = call.start + call.fed
    return call.start > 0 and any(
        m == seen and o != m for m, o in zip(mine.shape, full.shape, strict=False)
    )


def _first_own(call: Recorded, op: Op, reference: dict) -> Op:
    """The first of a run of ops only the cached path runs that ends at ``op``: back through
    the one operand each takes from another such op (a cat of the past and keys scaled on
    the cached path only is the scaling's doing)."""
    for _ in range(32):
        own = [p for v in op.tensors if v.kind == "op"
               and (p := call.record.producer(v)) is not None
               and reference.get(_key_of(call, p)) is None]  # fmt: skip
        if len(own) != 1:
            return op
        op = own[0]
    return op


def first_divergence(calls: list[Recorded]) -> Divergence | None:
    """The first op, over the cached calls in order, that computes other than the full
    forward (the first uncached call recorded) where both cover the same positions, and
    whose difference no op that reads it undoes."""
    full = next((c for c in calls if not c.cached), None)
    if full is None:
        return None
    reference = _keyed(full.record)
    for call in (c for c in calls if c.cached):
        for key, op in _keyed(call.record).items():
            if _agrees(call, op, full, reference) is not False:
                continue
            if _undone(call, op, full, reference):
                continue
            theirs = full.record.results[reference[key].index][0]
            through = _through_cache(call, op, full, reference)
            return Divergence(op, call.start, call.fed, _restarts(calls, key, theirs), through)
    return None


def _restarts(calls: list[Recorded], key: tuple[str, str, int], full: Tensor) -> bool:
    """Every cached call after the first computes at the op ``key`` what the full forward
    (``full``, its result there) computes for the first positions, as many as it was fed."""
    later = [c for c in calls if c.cached and c.start > 0]
    for call in later:
        op = _keyed(call.record).get(key)
        if op is None or not call.record.results[op.index]:
            return False
        mine = call.record.results[op.index][0]
        restart = _window(mine, full, call.start, call.fed, first=True)
        if restart is None or not _same(mine, restart):
            return False
    return bool(later)
