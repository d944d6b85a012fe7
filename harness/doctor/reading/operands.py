"""What the queries, keys and values of an attention are made of, read back through a recorded
forward: the projection each starts at (and the parameter it projects by), the projection its
output goes through, and the rotations on the way (rotary's ``q cos + rotate_half(q) sin``,
written with halves, an index or complex numbers), told apart from data merely laid out again."""

from __future__ import annotations

import math

from harness.doctor.reading.ops import (
    ADD,
    DIVIDE,
    LAYOUT,
    MULTIPLY,
    NORMS,
    PRODUCTS,
    SAME,
    SHAPED_LIKE_SECOND,
    data_operand,
    from_input,
    scalar,
    tensor_args,
    turned,
)
from harness.doctor.reading.record import Op, Record, Value


def is_projection(record: Record, op: Op, memo: dict[int, bool]) -> bool:
    """A linear op, data times a weight written out (x @ W), or a convolution by a kernel the
    module learns (a U-Net's 1x1 ``to_qkv``): where an operand's factors start."""
    if op.name in LINEAR or (op.name in PRODUCTS and weighted(record, op, memo)):
        return True
    kernel = op.arg(1, "weight")
    return op.name in CONVOLUTIONS and kernel is not None and kernel.kind == "parameter"


CONVOLUTIONS = frozenset({"conv1d", "conv2d", "conv3d"})
LINEAR = {"linear": (0, "input"), "addmm": (1, "mat1")}  # where each takes the data it projects


def weight_name(record: Record, op: Op, memo: dict[int, bool]) -> str | None:
    """The name of the parameter a projection multiplies by (followed back through ``.T`` or
    a transpose of it); None when it is no parameter of the module."""
    for value in tensor_args(op):
        for _ in range(4):
            if from_input(record, value, memo) or value.shape is None or len(value.shape) != 2:
                break
            if value.kind == "parameter":
                return str(value.ref)
            earlier = record.producer(value)
            if earlier is None or earlier.name not in LAYOUT | {"t", "T"} or not earlier.args:
                break
            value = earlier.args[0]
    return None


def weighted(record: Record, op: Op, memo: dict[int, bool]) -> bool:
    """A product of data with a weight (x @ W): a projection written out."""
    tensors = tensor_args(op)
    return sum(from_input(record, v, memo) for v in tensors) == 1


INPUT = -2  # a rotation's branches start at the call's input itself (no op made it)


def branch_sources(record: Record, value: Value, memo: dict[int, bool], depth: int = 0) -> set[int]:
    """The ops a rotation's branch starts from: followed back through layout, negation,
    slicing and products with tables (tensors that do not depend on the input)."""
    op = record.producer(value)
    if op is None or depth > 16:
        return {INPUT if value.kind == "input" and op is None else -1}
    data = [v for v in op.tensors if from_input(record, v, memo)]
    if op.name in SHAPED_LIKE_SECOND:  # reshape_as(x, like): the second gives a shape only
        data = data[:1]
    if op.name in MULTIPLY | DIVIDE and any(scalar(v) not in (None, 1.0) for v in op.args):
        return {op.index}  # a scale: the branches meet here, and it is read from here on
    # (a factor of 1 on each branch, rotary-embedding-torch's ``* scale``, changes nothing)
    passes = op.name in LAYOUT | SAME | MULTIPLY | {"neg", "__neg__", "chunk", "split", "unbind"}
    if passes and len(data) == 1:
        return branch_sources(record, data[0], memo, depth + 1)
    if op.name in {"cat", "stack"} and normed_pieces(record, data):
        return {op.index}  # heads normalized one by one and joined again: the branches meet
    if op.name in ADD | {"sub", "cat", "stack"} and data:
        found: set[int] = set()
        for v in data:
            found |= branch_sources(record, v, memo, depth + 1)
        return found
    return {op.index}


def normed_pieces(record: Record, data: list[Value]) -> bool:
    """``data`` are two or more pieces each normalized on its own (StableLM's LayerNorm per
    head, joined again by a stack)."""
    makers = [record.producer(v) for v in data]
    return len(makers) >= 2 and all(m is not None and m.name in NORMS for m in makers)


def value_projection(record: Record, value: Value, memo: dict[int, bool]) -> str | None:
    """The parameter the values are projected by: followed back through layout, scales and
    rotations to their projection."""
    for _ in range(64):
        op = record.producer(value)
        if op is None:
            return None
        if is_projection(record, op, memo):
            return weight_name(record, op, memo)
        if op.name in ADD | {"sub", "cat", "stack"}:
            value = rotated_source(record, op, memo)
        else:
            value = values_before(record, op, memo, value)
        if value is None:
            return None
    return None


def picked(record: Record, op: Op, value: Value) -> Value | None:
    """Where ``value`` (``op``'s result) is one of the tensors a ``stack`` joined, taken apart
    again along the axis it joined them on (flash-attn's ``stack([q, k, v], dim=2)``, then
    ``unbind(dim=2)`` or ``qkv[:, :, 2]``): that tensor, as it was before the stack. None
    otherwise."""
    joined_value = tensor_args(op)[0] if tensor_args(op) else None
    joined = record.producer(joined_value)
    if joined is None or joined.name != "stack" or joined_value is None:
        return None
    rank = len(joined_value.shape or ())
    parts = joined.tensors
    axis = joined.const(1, "dim", 0)
    if op.name == "unbind":
        dim, index = op.const(1, "dim", 0), value.item
    elif op.name == "select":
        dim, index = op.const(1, "dim"), op.const(2, "index")
    elif op.name == "__getitem__":
        key = op.const(1, "idx")
        key = key if isinstance(key, tuple) else (key,)
        whole = [i for i, k in enumerate(key) if isinstance(k, int)]
        if (
            Ellipsis in key
            or len(whole) != 1
            or any(k is not None and not isinstance(k, int | slice) for k in key)
        ):
            return None
        dim, index = whole[0], key[whole[0]]
    else:
        return None
    if not all(isinstance(n, int) for n in (axis, dim, index)) or not rank:
        return None
    if dim % rank != axis % rank or not -len(parts) <= index < len(parts):  # type: ignore[operator]
        return None
    return parts[index]  # type: ignore[index]


def values_before(
    record: Record, op: Op, memo: dict[int, bool], value: Value | None = None
) -> Value | None:
    """The data the values were before ``op`` (which made ``value``): the tensor a layout op
    lays out again (its first: ``cache.to(xq)`` is the cache; the one of a stack it takes
    apart again, ``picked``), a scale's or a negation's operand; None for any other op, or
    where that is no data (a buffer written in place, as a cache is: not followed)."""
    if op.name in SAME | LAYOUT:
        main = tensor_args(op)[0] if tensor_args(op) else None
        main = (picked(record, op, value) if value is not None else None) or main
    elif op.name in MULTIPLY | DIVIDE or op.name in {"neg", "__neg__"}:
        main = data_operand(record, op, memo)
    else:
        return None
    return main if main is not None and from_input(record, main, memo) else None


def output_of(record: Record, index: int, memo: dict[int, bool]) -> tuple[str | None, Op | None]:
    """Where the attention's result (op ``index``'s) goes, followed forward through layout ops:
    the parameter of the first projection that takes it, or, met first, a product with other
    data (AlphaFold's sigmoid gate, o * g), after which its output is not attention's alone.
    (None, None) where it reaches anything else first."""
    for _ in range(16):
        nxt = next(record.consumers(index), None)
        if nxt is None:
            return None, None
        if is_projection(record, nxt, memo):
            return weight_name(record, nxt, memo), None
        if nxt.name in MULTIPLY and sum(from_input(record, v, memo) for v in nxt.tensors) >= 2:
            return None, nxt
        if nxt.name not in SAME | LAYOUT:
            return None, None
        index = nxt.index
    return None, None


def rotation(
    record: Record, value: Value, memo: dict[int, bool], projected: bool = False
) -> Op | None:
    """Where ``value`` (the values) is rotated on its way from its projection, or on the way
    to it (Wav2Vec2-Conformer turns the hidden states before projecting them): a sum of its
    own halves of which one is turned by a table (v cos + rotate_half(v) sin), or a complex
    turn by a table; None when it is not. ``projected``: ``value`` is a projection's input
    (a second projection met ends the search)."""
    for _ in range(64):
        op = record.producer(value)
        if op is None:
            return None
        if op.name in LINEAR:
            data = projected_input(op)
            if projected or data is None:
                return None
            return rotation(record, data, memo, projected=True)
        if turned(record, op, memo):
            return op
        if op.name in ADD | {"sub", "cat", "stack"}:
            rotates = tabled(record, op, memo) and rotated_source(record, op, memo) is not None
            return op if rotates else None
        value = values_before(record, op, memo, value)
        if value is None:
            return None
    return None


def projected_input(op: Op) -> Value | None:
    """The data a linear op (``linear(x, W)``, ``addmm(b, x, W)``) projects; None for any
    other op."""
    data = op.arg(*LINEAR[op.name]) if op.name in LINEAR else None
    return data if data is not None and data.is_tensor else None


def tabled(record: Record, op: Op, memo: dict[int, bool], depth: int = 0) -> bool:
    """Some branch into ``op`` is data times a table (a tensor of more than one number that
    does not depend on the input: cos or sin of positions), not only laid out again."""
    if op.name in MULTIPLY and any(not from_input(record, v, memo) and math.prod(v.shape or ()) > 1
                                   for v in tensor_args(op)):  # fmt: skip
        return True
    if depth > 4 or not (
        op.name in ADD | LAYOUT | SAME | MULTIPLY | DIVIDE
        or op.name in {"sub", "cat", "stack", "neg", "__neg__"}
    ):
        return False
    return any(
        tabled(record, step, memo, depth + 1)
        for v in op.tensors
        if from_input(record, v, memo) and (step := record.producer(v)) is not None
    )


def rotated_source(record: Record, op: Op, memo: dict[int, bool]) -> Value | None:
    """The operand a sum of rotated halves comes from (q cos + rotate_half(q) sin), when every
    branch starts at the same op; None when it is a sum of different data."""
    data = [v for v in op.tensors if from_input(record, v, memo)]
    sources: set[int] = set()
    for v in data:
        sources |= branch_sources(record, v, memo)
    if len(sources) != 1 or -1 in sources:
        return None
    (index,) = sources
    if index == INPUT:  # the input, turned before anything else is done to it
        value = data[0]
        while (maker := record.producer(value)) is not None:
            value = next(v for v in maker.tensors if from_input(record, v, memo))
        return value
    source = record.ops[index]
    return Value("op", index, 0, source.shapes[0] if source.shapes else None)
