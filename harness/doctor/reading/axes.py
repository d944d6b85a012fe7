"""Where an axis of one op's tensor lands in another's, as a recorded forward laid it out: through
transposes and reshapes, by an einsum's letters, and which axis a product sums over. Nothing here
guesses from a name; an axis that cannot be followed is None."""

from __future__ import annotations

import math

from harness.doctor.reading.ops import from_input, multiplied, tensor_args
from harness.doctor.reading.record import Op, Record


def swapped_axes(op: Op, ndim: int) -> tuple[int, int] | None:
    """The two axes a ``transpose`` (or ``swapaxes``) of an ``ndim``-axis tensor swaps,
    counted from 0; None when they are not constants."""
    a, b = (op.const(i, n) for i, n in ((1, "dim0"), (2, "dim1")))
    if not isinstance(a, int) or not isinstance(b, int):
        return None
    return a % ndim, b % ndim


def permute_order(op: Op, ndim: int) -> list[int] | None:
    """The order a ``permute`` of an ``ndim``-axis tensor puts its axes in (``permute(0, 2, 1,
    3)`` or ``permute((0, 2, 1, 3))``), counted from 0; None when it is not constants."""
    order = [v.constant for v in op.args[1:]]
    if len(order) == 1 and isinstance(order[0], tuple | list):
        order = list(order[0])
    if not all(isinstance(o, int) for o in order):
        return None
    counted = [o % ndim for o in order]  # type: ignore[operator]
    return counted if sorted(counted) == list(range(ndim)) else None


def map_axis(op: Op, axis: int, ndim_in: int) -> int | None:
    """Where axis ``axis`` of a layout op's input is in its result (None: not known)."""
    out_ndim = len(op.shapes[0]) if op.shapes else None
    if op.name in {"transpose", "swapaxes"}:
        pair = swapped_axes(op, ndim_in)
        if pair is None:
            return None
        a, b = pair
        return b if axis == a else a if axis == b else axis
    if out_ndim == ndim_in and op.args and op.args[0].shape == op.shapes[0]:
        return axis  # a layout op that changed nothing
    if out_ndim is not None and op.args and op.args[0].shape is not None:
        shape_in, shape_out = op.args[0].shape, op.shapes[0]
        from_end = ndim_in - axis  # the trailing axes, when they are kept as they were
        if (
            from_end <= min(ndim_in, out_ndim)
            and shape_in[axis:] == shape_out[out_ndim - from_end :]
        ):
            return out_ndim - from_end
    return None


def pieces(op: Op, axis: int) -> list[int]:
    """The axes of a reshape's result that axis ``axis`` of its input is split into, outer
    first (``(B, T * h, S) -> (B, T, h, S)``: axes 1 and 2); none where it is not split alone."""
    if not op.shapes or not op.args or op.args[0].shape is None:
        return []
    shape_in, shape_out = op.args[0].shape, op.shapes[0]
    b_in = [math.prod(shape_in[:i]) for i in range(len(shape_in) + 1)]
    b_out = [math.prod(shape_out[:i]) for i in range(len(shape_out) + 1)]
    start, end = b_in[axis], b_in[axis + 1]
    if start not in b_out or end not in b_out:
        return []
    found = [i for i in range(len(shape_out)) if start <= b_out[i] < end and shape_out[i] > 1]
    return found if len(found) > 1 else []


def einsum_axis(record: Record, op: Op, axis: int, memo: dict[int, bool]) -> int | None:
    """Where axis ``axis`` of an einsum's one data operand is in its result, by its letter
    ("bhij,hg->bgij": i and j stay; h is summed, so no axis)."""
    spec = op.const(0, "equation")
    tensors = tensor_args(op)
    if not isinstance(spec, str) or "->" not in spec or "." in spec:
        return None
    inputs, output = spec.replace(" ", "").split("->")
    parts = inputs.split(",")
    data = [i for i, v in enumerate(tensors) if from_input(record, v, memo)]
    if len(parts) != len(tensors) or len(data) != 1 or axis >= len(parts[data[0]]):
        return None
    letter = parts[data[0]][axis]
    return output.index(letter) if letter in output else None


def product_axes(op: Op) -> tuple[int | None, int | None]:
    """The keys' and queries' axes of a scores product's result (keys: its second operand's)."""
    if not op.shapes:
        return None, None
    ndim = len(op.shapes[0])
    if op.name != "einsum":
        return ndim - 1, ndim - 2
    spec = op.const(0, "equation")
    if not isinstance(spec, str) or "->" not in spec or "." in spec:
        return None, None
    inputs, output = spec.replace(" ", "").split("->")
    parts = inputs.split(",")
    if len(parts) != 2:
        return None, None
    only_second = [c for c in output if c in parts[1] and c not in parts[0]]
    only_first = [c for c in output if c in parts[0] and c not in parts[1]]
    key = output.index(only_second[0]) if len(only_second) == 1 else None
    if len(only_first) > 1 and key is not None:  # keys shared by the heads (multi-query)
        only_first = [c for c in only_first if letter_size(op, c) == letter_size(op, output[key])]
    query = output.index(only_first[0]) if len(only_first) == 1 else None
    return key, query


def operand_axis(op: Op, operand: int, output_axis: int | None = None) -> int | None:
    """Where an einsum's ``operand`` holds a letter: that of its result's axis ``output_axis``,
    or where None, the one letter the two operands sum over (the keys, for weights times
    values); None where the equation does not say."""
    spec = op.const(0, "equation")
    if not isinstance(spec, str) or "->" not in spec or "." in spec:
        return None
    inputs, output = spec.replace(" ", "").split("->")
    parts = inputs.split(",")
    if len(parts) != 2 or operand > 1:
        return None
    if output_axis is not None:
        letters = [output[output_axis]] if output_axis < len(output) else []
    else:
        letters = [c for c in parts[0] if c in parts[1] and c not in output]
    found = [c for c in letters if c in parts[operand]]
    return parts[operand].index(found[0]) if len(found) == 1 else None


def letter_size(op: Op, letter: str) -> int | None:
    """The size of an einsum's result along ``letter`` (self-attention's queries are as many
    as its keys: of the letters q alone carries, heads and queries, that tells them apart
    where the keys are shared by every head)."""
    spec = op.const(0, "equation")
    output = spec.replace(" ", "").split("->")[1] if isinstance(spec, str) else ""
    return op.shapes[0][output.index(letter)] if letter in output and op.shapes else None


def summed_width(op: Op) -> int | None:
    """The size of the axis the product sums over (the head width for q k^T)."""
    tensors = multiplied(op)
    if len(tensors) < 2 or tensors[0].shape is None:
        return None
    if op.name == "einsum":
        spec = op.const(0, "equation")
        if not isinstance(spec, str) or "->" not in spec or "." in spec:
            return None
        inputs, output = spec.replace(" ", "").split("->")
        first = inputs.split(",")[0]
        summed = [i for i, c in enumerate(first) if c not in output]
        return tensors[0].shape[summed[0]] if len(summed) == 1 else None
    return tensors[0].shape[-1]


def weights_summed_axis(op: Op, position: int, ndim: int) -> int | None:
    """The axis of the weights (operand ``position`` of the product ``op``) that it sums over."""
    if op.name == "einsum":
        spec = op.const(0, "equation")
        if not isinstance(spec, str) or "->" not in spec or "." in spec:
            return None
        inputs, output = spec.replace(" ", "").split("->")
        parts = inputs.split(",")
        if len(parts) != 2 or len(parts[position]) != ndim:
            return None
        mine, other = parts[position], parts[1 - position]
        summed = [i for i, c in enumerate(mine) if c not in output and c in other]
        return summed[0] if len(summed) == 1 else None
    return ndim - 1 if position == 0 else ndim - 2 if position == 1 else None


def softmax_axis(op: Op, ndim: int) -> int | None:
    dim = op.const(1, "dim")
    given = op.arg(1, "dim")
    if dim is None and (given is None or given.kind == "constant"):  # F.softmax(x): implicit
        return 0 if ndim in (0, 1, 3) else 1  # the legacy axis F.softmax picks (and warns)
    return dim % ndim if isinstance(dim, int) and ndim else None


def rows_hold(shape_in: tuple[int, ...], shape_out: tuple[int, ...], axis: int) -> bool:
    """Whether a reshape from ``shape_in`` to ``shape_out`` keeps axis ``axis`` whole inside one
    output axis other than the last, the features' (``(T, B * h, d) -> (T * B, h * d)``, which
    flattens the positions with the batch for a linear layer and leaves the heads with the
    width), so the axis is not mixed with the features."""
    outer_in = [math.prod(shape_in[:i]) for i in range(len(shape_in) + 1)]
    outer_out = [math.prod(shape_out[:i]) for i in range(len(shape_out) + 1)]
    start, end = outer_in[axis], outer_in[axis + 1]
    return any(
        outer_out[j] <= start and end <= outer_out[j + 1] and end % outer_out[j] == 0
        for j in range(len(shape_out) - 1)
    )


def leads_a_merge(shape_in: tuple[int, ...], shape_out: tuple[int, ...], axis: int) -> bool:
    """Whether axis ``axis`` of ``shape_in`` is, in ``shape_out``, an axis other than the last
    kept whole and in front, with the leading part of the next one merged in behind it
    (``(B, T, h * d) -> (B, T * h, d)``: a row for each position's head, as multi-query
    attention lays its queries out), so the positions are not mixed with the features."""
    outer_in = [math.prod(shape_in[:i]) for i in range(len(shape_in) + 1)]
    outer_out = [math.prod(shape_out[:i]) for i in range(len(shape_out) + 1)]
    start, end = outer_in[axis], outer_in[axis + 1]
    return any(
        outer_out[j] == start and outer_out[j + 1] < end < outer_out[j + 2]
        and end % outer_out[j + 1] == 0
        for j in range(len(shape_out) - 1)
    )  # fmt: skip


def clean_axis(shape_in: tuple[int, ...], shape_out: tuple[int, ...], axis: int) -> int | None:
    """Where axis ``axis`` lands when a tensor of ``shape_in`` is reshaped (in its logical
    order) to ``shape_out``. A reshape maps runs of input axes to runs of output axes between the
    element counts both share; the axis is kept when its run is itself and one output axis (that
    axis is returned), merged into one axis or split into several (None: not followed further),
    and cut up when its run holds other input axes and several output axes (-1: it is mixed with
    them, as (B, h, T, d) -> (B, T, h * d) mixes heads with positions)."""

    def bounds(shape: tuple[int, ...]) -> list[int]:
        return [math.prod(shape[:i]) for i in range(len(shape) + 1)]

    b_in, b_out = bounds(shape_in), bounds(shape_out)
    shared = sorted(set(b_in) & set(b_out))
    low = max(b for b in shared if b <= b_in[axis])
    high = min(b for b in shared if b >= b_in[axis + 1])
    ins = [i for i in range(len(shape_in)) if low <= b_in[i] < high and shape_in[i] > 1]
    outs = [i for i in range(len(shape_out)) if low <= b_out[i] < high and shape_out[i] > 1]
    if len(ins) > 1 and len(outs) > 1:
        return -1
    if ins == [axis] and len(outs) == 1:
        return outs[0]
    return None


def span(shape: tuple[int, ...], axis: int) -> tuple[int, int]:
    """Axis ``axis`` of ``shape`` as the run of the tensor's logical (row-major) order it
    strides over: the element counts of the axes before it, and of those and it."""
    return math.prod(shape[:axis]), math.prod(shape[: axis + 1])


def axis_at(shape: tuple[int, ...], run: tuple[int, int]) -> int | None:
    """The axis of ``shape`` that strides over ``run`` (``span``'s), when one does: an axis a
    reshape split into pieces, found again whole where a later reshape merges them back."""
    found = [i for i in range(len(shape)) if shape[i] > 1 and span(shape, i) == run]
    return found[0] if len(found) == 1 else None


def indexed_axis(key: object, ndim_in: int, axis: int) -> int | None:
    """Where axis ``axis`` of ``x[key]`` was in ``x`` (``ndim_in`` axes): an integer drops
    its axis (``qkv[0]``), a slice keeps it, None adds one, ``...`` stands for the axes no
    other item names. None where the result's axis is a new one, or ``key`` holds anything
    else (a tensor picks rows: not followed)."""
    items = key if isinstance(key, tuple) else (key,)
    if any(not isinstance(k, int | slice) and k is not None and k is not Ellipsis for k in items):
        return None
    named = sum(isinstance(k, int | slice) for k in items)
    origin: list[int | None] = []  # for each axis of the result, the input's axis
    at = 0
    for k in items:
        if k is Ellipsis:
            origin += range(at, at + ndim_in - named)
            at += ndim_in - named
        elif k is None:
            origin.append(None)
        else:
            origin += [at] if isinstance(k, slice) else []
            at += 1
    origin += range(at, ndim_in)
    return origin[axis] if 0 <= axis < len(origin) else None
