"""The op names a reading knows, and what it asks of one op's arguments: which are tensors, which
depend on the call's input (data, not weights or constants), and a number an op was given."""

from __future__ import annotations

import math

from harness.doctor.reading.record import Op, Record, Value

SOFTMAX = {"softmax", "_softmax"}
SDPA = {"scaled_dot_product_attention"}
PRODUCTS = {"matmul", "__matmul__", "bmm", "einsum", "baddbmm"}
MULTIPLY = {"mul", "__mul__", "__rmul__", "mul_", "multiply"}
DIVIDE = {"div", "__truediv__", "true_divide", "div_", "divide"}
ADD = {"add", "__add__", "__radd__", "add_"}
FILL = {"masked_fill", "masked_fill_"}
# ops whose result is their main operand's values, the same cells: followed without a change
SAME = {"float", "to", "type", "type_as", "half", "bfloat16", "double", "contiguous", "clone",
        "dropout", "detach", "nan_to_num", "clamp", "clamp_min", "clamp_max"}  # fmt: skip
# ops that lay the same values out again: followed, with their axes mapped where they can be
LAYOUT = {"transpose", "permute", "view", "reshape", "unsqueeze", "squeeze", "flatten",
          "unflatten", "expand", "expand_as", "repeat", "repeat_interleave", "tile",
          "__getitem__", "swapaxes", "mT", "movedim", "narrow", "select", "split", "chunk",
          "unbind", "tensor_split", "split_with_sizes", "view_as_complex",
          "view_as_real", "index_select", "view_as", "reshape_as"}  # fmt: skip
NORMS = {"layer_norm", "rms_norm", "group_norm", "normalize"}  # their output's scale is set
CAPS = {"tanh"}
TILES = {"repeat", "tile"}  # copies of a tensor laid end to end along an axis
# dropout ops, with the position and name of the argument that turns them on
DROPOUT = {"dropout": (2, "training"), "alpha_dropout": (2, "training"),
           "feature_alpha_dropout": (2, "training"), "dropout1d": (2, "training"),
           "dropout2d": (2, "training"), "dropout3d": (2, "training")}  # fmt: skip


# elementwise bounds: with one operand a single number, a clamp (``torch.max(s, min)``)
BOUNDS = {"max", "maximum", "min", "minimum", "fmax", "fmin"}


def is_clamp(op: Op) -> bool:
    """``torch.max(scores, torch.tensor(lowest))``: an elementwise bound by one number, which
    keeps the scores' cells where they are (not a reduction over an axis)."""
    if op.name not in BOUNDS or len(op.args) != 2 or "dim" in op.kwargs:
        return False
    return op.args[0].is_tensor and op.args[1].is_tensor and op.args[1].scalar is not None


def tensor_args(op: Op) -> list[Value]:
    return [v for v in op.args if v.is_tensor] or op.tensors


def multiplied(op: Op) -> list[Value]:
    """The tensors a product multiplies, in order: its tensor arguments, less the term
    ``baddbmm`` adds (``bias.baddbmm(batch1=q, batch2=k)``: its operands by position or name)."""
    if op.name != "baddbmm":
        return tensor_args(op)
    operands = (op.arg(1, "batch1"), op.arg(2, "batch2"))
    return [v for v in operands if v is not None and v.is_tensor]


# Ops that take only a tensor's dtype, device or shape from some of their tensor arguments: a
# mask made like the input (Meta's Llama: ``mask.type_as(h)``; ``x.new_zeros``) is no data.
# (Not ``to(other)``: a cache moved like the input, ``cache_k.to(xq)``, is then written with it,
# and the record does not follow writes in place.)
SHAPED_LIKE_SECOND = {"type_as", "expand_as", "view_as", "reshape_as"}
SHAPED_LIKE_ALL = {"zeros_like", "ones_like", "full_like", "empty_like", "new_zeros", "new_ones",
                   "new_full", "new_empty", "new_tensor"}  # fmt: skip


def from_input(record: Record, value: Value, memo: dict[int, bool]) -> bool:
    """Whether ``value`` depends on the call's input (not only on weights and constants)."""
    if value.kind == "input":
        return True
    op = record.producer(value)
    if op is None:
        return False
    if op.index not in memo:
        memo[op.index] = False  # a cycle cannot happen; this only bounds the recursion
        data = op.tensors
        if op.name in SHAPED_LIKE_ALL:
            data = []
        elif op.name in SHAPED_LIKE_SECOND:
            data = data[:1]
        memo[op.index] = any(from_input(record, v, memo) for v in data)
    return memo[op.index]


def scalar(value: Value) -> float | None:
    """A number an op was given: a constant, or a one-element tensor that is not data."""
    if (
        value.kind == "constant"
        and isinstance(value.constant, int | float)
        and not isinstance(value.constant, bool)
    ):
        return float(value.constant)
    if value.is_tensor and value.scalar is not None and math.prod(value.shape or ()) == 1:
        return value.scalar
    return None


def turned(record: Record, op: Op, memo: dict[int, bool]) -> bool:
    """A complex product of data with a complex table (Meta's ``xq_ * freqs_cis``): a rotation
    of each pair, not a scale."""
    if op.name not in MULTIPLY:
        return False
    tables = [v for v in tensor_args(op) if not from_input(record, v, memo)]
    return any(v.dtype is not None and v.dtype.is_complex for v in tables)


def data_operand(record: Record, op: Op, memo: dict[int, bool]) -> Value | None:
    """The operand of an elementwise op that carries the data (depends on the input)."""
    data = [v for v in tensor_args(op) if from_input(record, v, memo)]
    return data[0] if data else None
