"""Heads split without the transpose, read back from an operand of the attention: its positions'
axis followed from the product to the projection that made it, through the layout ops on the
way. A reshape that builds that axis out of pieces of several input axes, as ``view(B, h, T, d)``
of a (B, T, h d) projection does, has cut the positions up and mixed them with the heads."""

from __future__ import annotations

import math

from harness.doctor.reading.axes import (
    clean_axis,
    indexed_axis,
    leads_a_merge,
    map_axis,
    permute_order,
    rows_hold,
)
from harness.doctor.reading.operands import is_projection
from harness.doctor.reading.ops import ADD, DIVIDE, LAYOUT, MULTIPLY, SAME, data_operand
from harness.doctor.reading.record import Op, Record, Value

RESHAPES = {"view", "reshape", "flatten", "unflatten", "view_as", "reshape_as"}
DROPS_AN_AXIS = {"unbind", "select"}  # the result lacks the axis ``dim`` names
KEEPS_AXES = {"split", "chunk", "narrow", "tensor_split", "split_with_sizes"}
# elementwise ops (rotary's q * cos + rotate_half(q) * sin): the axes stay where the shape does
ELEMENTWISE = ADD | MULTIPLY | DIVIDE | {"sub", "__sub__", "neg", "__neg__"}

CUT = -1  # clean_axis's answer for an axis made of pieces of several
MOVES = {"transpose", "swapaxes", "permute"}  # ops that move an axis to another place


def axis_before(op: Op, item: int, axis: int) -> int | None:
    """Where axis ``axis`` of result ``item`` of a layout op was in its input: ``CUT`` for a
    reshape that made it of pieces of several input axes, None where the op does not say."""
    if not op.args or op.args[0].shape is None or len(op.shapes) <= item:
        return None
    shape_in, shape_out = op.args[0].shape, op.shapes[item]
    ndim_in = len(shape_in)
    if op.name in SAME or (op.name in KEEPS_AXES and len(shape_out) == ndim_in):
        return axis
    if op.name in {"transpose", "swapaxes"}:
        return map_axis(op, axis, ndim_in)  # a swap is its own inverse
    if op.name == "permute":
        order = permute_order(op, ndim_in)
        return None if order is None else order[axis]
    if op.name == "__getitem__":
        return indexed_axis(op.const(1, "idx"), ndim_in, axis)
    if op.name in DROPS_AN_AXIS:
        dim = op.const(1, "dim", 0)
        return None if not isinstance(dim, int) else axis if axis < dim % ndim_in else axis + 1
    if op.name in RESHAPES:
        before = clean_axis(shape_out, shape_in, axis)
        if before == CUT and rows_hold(shape_out, shape_in, axis):
            return None  # held whole in one input axis (positions flattened with the batch)
        if before == CUT and leads_a_merge(shape_out, shape_in, axis):
            return None  # one input axis whole, the heads merged in behind it (multi-query)
        return before
    return axis if shape_out == shape_in else None


def piece_of(op: Op, item: int, axis: int) -> int | None:
    """The one input axis a reshape split into several, axis ``axis`` of its result among them
    (``(B, T, 3 C)`` viewed as ``(B, T, 3, h, d)``: the heads are a piece of the features);
    None where it is not such a piece."""
    if op.name not in RESHAPES or not op.args or op.args[0].shape is None:
        return None
    shape_in, shape_out = op.args[0].shape, op.shapes[item]
    bounds_in = [math.prod(shape_in[:i]) for i in range(len(shape_in) + 1)]
    bounds_out = [math.prod(shape_out[:i]) for i in range(len(shape_out) + 1)]
    low, high = bounds_out[axis], bounds_out[axis + 1]
    holding = [i for i in range(len(shape_in)) if bounds_in[i] <= low and high <= bounds_in[i + 1]]
    return holding[0] if len(holding) == 1 and shape_in[holding[0]] > shape_out[axis] else None


def positions_cut(
    record: Record, value: Value, axis: int, memo: dict[int, bool]
) -> tuple[Op, bool] | None:
    """Where the positions' axis ``axis`` of ``value`` (an operand of the attention), followed
    back to the projection that made it, is not the projection's positions: the reshape that
    cut it out of several axes (False), or the op that put there a piece of the projection's
    features, heads where positions belong (True: a permute that swapped them). None when the
    axis comes whole from the projection's positions, or cannot be followed back to it."""
    placed: Op | None = None  # the nearest axis-moving op, walking back, after a piece split
    piece: Op | None = None
    for _ in range(64):
        op = record.producer(value)
        if op is None:
            return None
        if is_projection(record, op, memo):
            features = value.shape is not None and axis == len(value.shape) - 1 > 0
            return ((placed or piece), True) if piece is not None and features else None
        if op.name not in LAYOUT | SAME | ELEMENTWISE:
            return None
        before = axis_before(op, value.item, axis)
        if before == CUT:
            return op, False
        if before is None and (before := piece_of(op, value.item, axis)) is not None:
            piece = op
        elif op.name in MOVES and piece is None and before != axis:
            placed = op
        main = data_operand(record, op, memo)
        if before is None or main is None or main.shape is None:
            return None
        value, axis = main, before
    return None
