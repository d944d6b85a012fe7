"""Where a cache writes the keys it is fed, and the line that decided it.

A cached call fed positions ``s .. s + m - 1`` must write them at those slots of the tensor that
holds the keys (or at those positions modulo its length, for a rolling buffer). The tensors a
module or its cache object holds are compared before and after each call; the first call marks
which of their axes is the cache's positions' axis (it changes a run of exactly as many slots
as it was fed there). A call that writes elsewhere is recorded again, op by op, to find the op
that wrote the tensor and what decided its slots: the index it was given, back to the line
that computed it, or, for an index read from a counter the cache keeps (torchtune's
``cache_pos``), to the line that last moved the counter, in an earlier call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from harness.doctor.reading.record import (
    Op,
    Record,
    Recorder,
    Value,
    forwards,
    known_tensors,
)

CACHE = "cache"  # the prefix of the tensors a cache object holds, by name
DEPTH = 4  # how far into a cache object's attributes its tensors are looked for


def _object_tensors(
    value: object, name: str, depth: int, seen: set[int]
) -> Iterator[tuple[str, Tensor]]:
    """The tensors reachable from ``value`` through attributes, items and submodules."""
    if id(value) in seen or depth < 0:
        return
    seen.add(id(value))
    if isinstance(value, Tensor):
        yield name, value
        return
    if isinstance(value, nn.Parameter):
        return
    if isinstance(value, list | tuple):
        items: Iterator[tuple[object, object]] = iter(enumerate(value))
    elif isinstance(value, dict):
        items = iter(value.items())
    elif isinstance(value, nn.Module):  # its buffers and submodules by their names
        plain = [(k, v) for k, v in vars(value).items() if not k.startswith("_")]
        items = iter([*plain, *value.named_buffers(recurse=False), *value.named_children()])
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        items = iter(vars(value).items())
    else:
        return
    for key, item in items:
        if isinstance(item, Tensor | list | tuple | dict) or hasattr(item, "__dict__"):
            yield from _object_tensors(item, f"{name}.{key}", depth - 1, seen)


def live(module: nn.Module, cache: object = None) -> dict[str, Tensor]:
    """Every tensor ``module`` holds outside its parameters (buffers, tensor attributes, in its
    submodules too), and every tensor the cache object holds (``cache.<path>``), by name."""
    parameters = {id(p) for p in module.parameters()}
    found: dict[str, Tensor] = {}
    for prefix, sub in module.named_modules():
        for name, value in [*vars(sub).items(), *sub.named_buffers(recurse=False)]:
            if isinstance(value, Tensor) and id(value) not in parameters:
                found[f"{prefix}.{name}".lstrip(".")] = value
    if cache is not None:
        for name, value in _object_tensors(cache, CACHE, DEPTH, set()):
            if id(value) not in parameters:
                found.setdefault(name, value)
    return found


Held = dict[str, Tensor]  # copies of the floating tensors a module and its cache hold, by name


def held(module: nn.Module, cache: object = None) -> Held:
    """A copy of every floating tensor ``live`` finds."""
    return {n: t.detach().clone() for n, t in live(module, cache).items() if t.is_floating_point()}


@dataclass
class Call:
    """One cached call: its first position, the tokens fed, and what was held around it."""

    start: int
    fed: int
    before: Held
    after: Held


def _changed_along(before: Tensor, after: Tensor, axis: int) -> list[int]:
    """The indices along ``axis`` where any cell changed."""
    moved = (before != after) & ~(before.isnan() & after.isnan())
    others = [a for a in range(moved.dim()) if a != axis]
    return moved.any(dim=others).nonzero().flatten().tolist() if others else []


def _run(indices: list[int], length: int) -> bool:
    """``indices`` are ``length`` consecutive slots."""
    return len(indices) == length and indices[-1] - indices[0] + 1 == length


def expected_slots(start: int, fed: int, size: int) -> list[int]:
    """The slots positions ``start .. start + fed - 1`` belong at along an axis of ``size``:
    themselves, or modulo ``size`` in a rolling buffer they overrun."""
    return sorted({p % size for p in range(start, start + fed)})


@dataclass(frozen=True)
class Misplaced:
    """A cached call (``call``, its index) that wrote the tensor ``name`` at ``wrote`` where
    its positions belong at ``meant``."""

    call: int
    name: str
    start: int
    fed: int
    wrote: list[int]
    meant: list[int]

    def __str__(self) -> str:
        return (f"the call fed positions {self.start}..{self.start + self.fed - 1} wrote "
                f"`{self.name}` at slots {self.wrote[0]}..{self.wrote[-1]}")  # fmt: skip


def _before(call: Call, name: str) -> Tensor | None:
    """What ``name`` held before ``call``: zeros where the call made it (a cache that makes
    its buffers on first use)."""
    if name in call.before:
        return call.before[name]
    return torch.zeros_like(call.after[name]) if name in call.after else None


def misplaced(calls: list[Call]) -> Misplaced | None:
    """The first call that wrote a held tensor away from its positions: the first call
    (positions 0..n-1) marks the tensor's positions' axis, as the one along which it changed a
    run of n slots (wherever that run is), and every call must write its own positions."""
    if not calls or calls[0].start != 0:
        return None
    first = calls[0]
    for name, now in first.after.items():
        was = _before(first, name)
        if was is None or now.shape != was.shape:
            continue
        axes = [a for a in range(was.dim()) if was.shape[a] > first.fed
                and _run(_changed_along(was, now, a), first.fed)]  # fmt: skip
        if len(axes) != 1:
            continue
        for index, call in enumerate(calls):
            ahead, behind = _before(call, name), call.after.get(name)
            if ahead is None or behind is None or ahead.shape != behind.shape:
                continue
            wrote = _changed_along(ahead, behind, axes[0])
            meant = expected_slots(call.start, call.fed, ahead.shape[axes[0]])
            if wrote and wrote != meant:
                return Misplaced(index, name, call.start, call.fed, wrote, meant)
    return None


@dataclass
class Watched:
    """One cached call recorded op by op, and the tensors held after it, by name."""

    record: Record
    held: dict[str, Tensor]


def recording(invoke: Callable[..., object], watched: list[Watched]) -> Callable[..., object]:
    """``invoke`` (a subject's calls), each call recorded into ``watched``; the tensors held
    before it are known to the record by name."""

    def call(module: nn.Module, xs: Tensor, mask, positions, cache, start: int) -> object:
        if cache is None:  # the full forward the cached calls are compared with
            return invoke(module, xs, mask, positions, cache, start)
        known = known_tensors(module)
        for name, tensor in live(module, cache).items():
            known.setdefault(id(tensor), ("attribute", name))
        recorder = Recorder(known, {}, forwards(module))
        try:
            with recorder:
                return invoke(module, xs, mask, positions, cache, start)
        finally:
            watched.append(Watched(recorder.record, live(module, cache)))

    return call


WRITES = ("__setitem__", "index_copy_", "index_put_", "scatter_", "copy_", "index_fill_")


def _storage(tensor: Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _writer(record: Record, tensor: Tensor, before: int | None = None) -> Op | None:
    """The last op of ``record`` (before op ``before``) that wrote into ``tensor``'s memory."""
    where = _storage(tensor)
    ops = record.ops[:before] if before is not None else record.ops
    for op in reversed(ops):
        writes = op.name in WRITES or (op.name.endswith("_") and not op.name.endswith("__"))
        results = record.results[op.index]
        if writes and op.line and any(_storage(r) == where for r in results):
            return op
    return None


def _index(record: Record, op: Op) -> Value | None:
    """The tensor that told ``op`` (a write) which slots to write: its index, or the index of
    the view it copies into (``cache[:, :, pos].copy_(k)``)."""
    if op.name in ("index_copy_", "index_fill_"):
        return op.arg(1, "index")
    if op.name == "scatter_":
        return op.arg(2, "index")
    if op.name in ("__setitem__", "index_put_"):
        key = op.arg(1, "indices")
        keys = key.constant if key is not None and isinstance(key.constant, tuple) else (key,)
        found = [v for v in keys if isinstance(v, Value) and v.is_tensor]
        return found[0] if found else None
    if op.name == "copy_":
        view = record.producer(op.arg(0, "self"))
        return _index(record, view) if view is not None and view.name == "__getitem__" else None
    return None


# Ops that only pick or lay out an index's values: the slots they give were decided earlier
LAYOUT = frozenset({
    "__getitem__", "view", "reshape", "expand", "expand_as", "flatten", "squeeze", "unsqueeze",
    "contiguous", "clone", "to", "long", "int", "type", "detach", "narrow",
})  # fmt: skip


# Arithmetic that leaves its tensor as it was when every number it is given is this one
IDENTITY = {"add": 0, "__add__": 0, "__radd__": 0, "sub": 0, "__sub__": 0, "__iadd__": 0,
            "mul": 1, "__mul__": 1, "__rmul__": 1}  # fmt: skip


def _passes_through(op: Op) -> bool:
    """``op`` leaves the values of its one tensor input as they were: a layout op, or
    arithmetic by numbers that change nothing (``slots + 0``: an offset that is 0 here)."""
    if op.name in LAYOUT:
        return True
    numbers = [v.constant for v in op.args if v.kind == "constant"]
    return (op.name in IDENTITY and len(op.tensors) == 1
            and all(n == IDENTITY[op.name] for n in numbers))  # fmt: skip


def _last_writer(watched: list[Watched], call: int, tensor: Tensor, before: int) -> Op | None:
    """The op that last wrote ``tensor`` before op ``before`` of call ``call``: in that call,
    or in an earlier one."""
    last = _writer(watched[call].record, tensor, before)
    for earlier in reversed(watched[:call]):
        if last is not None:
            break
        last = _writer(earlier.record, tensor)
    return last


def decided(watched: list[Watched], call: int, name: str) -> tuple[Op, Op] | None:
    """(the op of call ``call`` that wrote the held tensor ``name``, the op that decided its
    slots): followed back from its index through ops that pass values through, the first op
    that made new values; for an index read from a tensor the module or its cache holds (a
    counter), the op that last wrote that tensor, in this call or an earlier one; the write
    itself where the index came from the caller or from plain numbers."""
    record, now = watched[call].record, watched[call].held
    target = now.get(name)
    write = _writer(record, target) if target is not None else None
    if write is None:
        return None
    value = _index(record, write)
    for _ in range(32):
        if value is None or value.kind == "input":
            return write, write
        if value.kind in ("attribute", "buffer") and isinstance(value.ref, str):
            counter = now.get(value.ref)
            last = None if counter is None else _last_writer(watched, call, counter, write.index)
            return write, last or write
        op = record.producer(value)
        if op is None:
            return write, write
        if not _passes_through(op):
            return write, op
        value = op.tensors[0] if op.tensors else None
    return write, write
