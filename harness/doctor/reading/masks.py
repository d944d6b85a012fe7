"""The masks a reading finds on the scores: the cells each blocks (from the recorded values), with
what, and whether it is the caller's mask or the module's own, cut from a triangle it built."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from harness.doctor.reading.ops import from_input, scalar, tensor_args
from harness.doctor.reading.record import Op, Record, Value


@dataclass
class Fill:
    """A mask applied to the scores: the op, the fill value (None: added, not filled), and the
    boolean cells it blocks, broadcast to the scores (None: not known)."""

    op: Op
    value: float | None
    cells: Tensor | None
    mask: Value | None = None  # the argument that holds the mask
    own: bool = True  # made by the module itself, not the caller's mask
    made_here: bool = False  # part of it made by the module from nothing (an arange, a buffer)
    band: Op | None = None  # the triangle or comparison that cuts off the far past, if one does
    origin: Op | None = None  # where the module built it (a tril, a triu), when it did
    held: Value | None = None  # the buffer or attribute it is cut from, when it is
    cut: Op | None = None  # the op that cut it from that buffer (``bias[:, :, :T, :S]``)
    nan: Op | None = None  # an added mask that holds NaN: the op that made it
    added: float | None = None  # an added mask's most negative value, where it is finite
    spread: float | None = None  # the scores' spread over the cells it keeps, in the recorded call


def filled(record: Record, op: Op) -> Fill:
    """The cells a ``masked_fill`` blocks and its value."""
    mask = op.arg(1, "mask")
    value = scalar(op.arg(2, "value")) if op.arg(2, "value") is not None else None
    cells = record.result(mask) if mask is not None else None
    shape = op.shapes[0] if op.shapes else None
    if cells is not None and shape is not None:
        try:
            cells = cells.bool().expand(shape)
        except RuntimeError:
            cells = None
    return Fill(op, value, cells, mask)


BLOCKING = -1e4  # an added value this negative (or a fill) blocks its cell


def sdpa_fill(record: Record, op: Op, mask: Value, values: Tensor, shape: tuple[int, ...]) -> Fill:
    """The cells an SDPA call's ``attn_mask`` blocks on its (B, h, T, S) scores: False in a
    bool mask (filled with -inf), very negative in an added one; an added one holding NaN (0 *
    -inf) is marked with the op that made it, as ``added_mask`` marks one added by hand."""
    bool_mask = values.dtype == torch.bool
    blocked = ~values if bool_mask else values <= BLOCKING
    nan = None if bool_mask or not values.isnan().any() else nan_made(record, mask, op)
    try:
        cells = blocked.expand(shape)
    except RuntimeError:
        cells = None
    added = None if bool_mask else _finite_lowest(values, blocked)
    return Fill(op, -math.inf if bool_mask else None, cells, mask, nan=nan, added=added)


def spread(scores: Tensor | None, blocked: Tensor | None) -> float | None:
    """The standard deviation of the finite scores a mask meets, over the cells it keeps (all of
    them where its cells are not known); None where there are too few."""
    if scores is None or not scores.is_floating_point():
        return None
    values = scores.detach().double()
    if blocked is not None and blocked.shape == values.shape:
        values = values[~blocked]
    values = values[values.isfinite()]
    return float(values.std()) if values.numel() > 1 else None


def nan_made(record: Record, value: Value, otherwise: Op) -> Op:
    """The op that first made NaN in ``value`` (one whose inputs hold none: ``m * -inf``, 0
    times -inf), followed back through the ops that carried it (a slice, an add)."""
    op = record.producer(value)
    found = op or otherwise
    for _ in range(32):
        if op is None:
            break
        found = op
        carried = [v for v in op.tensors
                   if (t := record.result(v)) is not None and t.is_floating_point()
                   and bool(t.isnan().any())]  # fmt: skip
        if not carried:
            break
        op = record.producer(carried[0])
    return found


def _finite_lowest(values: Tensor, blocked: Tensor) -> float | None:
    """The most negative value an added mask blocks with, where it is finite (a fill that
    large logits can outgrow); None where it blocks nothing, or with -inf."""
    lowest = float(values[blocked].min()) if blocked.any() else None
    return lowest if lowest is not None and math.isfinite(lowest) else None


def added_mask(record: Record, op: Op, memo: dict[int, bool]) -> Fill | None:
    """A mask added to the scores (a tensor that does not depend on the input, with very
    negative cells), or chosen with ``where``: the cells it blocks."""
    shape = op.shapes[0] if op.shapes else None
    if op.name == "where":
        chosen = [v for v in op.args[1:3] if not from_input(record, v, memo)]
        condition = record.result(op.args[0]) if op.args and op.args[0].is_tensor else None
        number = scalar(chosen[0]) if chosen else None
        if condition is None or number is None or number > BLOCKING or shape is None:
            return None
        blocked = ~condition.bool() if op.args[2] in chosen else condition.bool()  # where False
        try:
            return Fill(op, number, blocked.expand(shape), op.args[0])
        except RuntimeError:
            return Fill(op, number, None, op.args[0])
    for v in tensor_args(op):
        tensor = record.result(v)
        if from_input(record, v, memo) or tensor is None or not tensor.is_floating_point():
            continue
        blocking, nan = tensor <= BLOCKING, tensor.isnan()
        if (blocking | nan).any() and shape is not None:
            made = nan_made(record, v, op) if nan.any() else None  # 0 * -inf: NaN
            added = _finite_lowest(tensor, blocking)
            try:
                return Fill(op, None, blocking.expand(shape), v, nan=made, added=added)
            except RuntimeError:
                return Fill(op, None, None, v, nan=made, added=added)
    return None


TRIANGLES = {"tril", "triu", "tril_", "triu_"}
BOUNDS = {"lt", "le", "gt", "ge"}  # comparisons of positions that bound a band of keys


def provenance(record: Record, fill: Fill) -> None:
    """Whether a fill's mask is the caller's (it comes from a tensor the harness made for the
    call: the mask it encodes) or the module's own, and the triangle the module built it from."""
    seen, todo = set(), [fill.mask] if fill.mask is not None else []
    while todo:
        value = todo.pop()
        op = record.producer(value)
        if op is None:
            if value.kind in ("tensor",):  # handed in from outside the module
                fill.own = False
            elif value.kind in ("buffer", "attribute"):
                fill.held, fill.made_here = value, True
            continue
        if op.index in seen:
            continue
        seen.add(op.index)
        if not op.line:  # the harness made it: the caller's mask
            fill.own = False
            continue
        fill.made_here = fill.made_here or not op.tensors  # a factory: arange, ones, full
        if any(v.kind in ("buffer", "attribute") for v in op.tensors[:1]):
            fill.cut = op if fill.cut is None or op.index < fill.cut.index else fill.cut
        if op.name in TRIANGLES and (fill.origin is None or op.index < fill.origin.index):
            fill.origin = op
        if op.name in TRIANGLES | BOUNDS and _cuts_the_past(record.results[op.index]):
            fill.band = op if fill.band is None or op.index < fill.band.index else fill.band
        todo += op.tensors


def _cuts_the_past(results: tuple[Tensor, ...]) -> bool:
    """A (..., T, S) boolean that holds both values behind the diagonal: a band of recent keys
    (``triu(-w)``, ``j > i - w``), not a causal triangle (all one value there)."""
    if not results or results[0].dtype != torch.bool or results[0].dim() < 2:
        return False
    cells = results[0]
    T, S = cells.shape[-2:]
    behind = torch.ones(T, S, dtype=torch.bool).tril(S - T - 1)  # keys before each query's own
    past = cells[..., behind]
    return bool(past.any()) and not bool(past.all())
