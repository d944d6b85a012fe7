"""Find the attention in a recorded forward by what it computes, and read its facts.

An attention site is a softmax (or an SDPA call). Its scores are followed back, through
elementwise ops (a scale, a mask, a cap) and changes of layout, to the product that made them
(``matmul``, ``bmm``, ``@``, ``einsum``); its weights are followed forward to the product with
the values. What is read from there is what ran, not what anything is called:

- the keys' axis: the axis of the weights that the product with the values sums over (else the
  last axis of the scores' product); the softmax's own axis;
- the constant factors on the scores (between the product and the softmax) and on its two
  operands (back to their projections), and the width the product sums over;
- each mask applied: the cells it fills (from the record's values) and with what.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from harness.doctor.reading.axes import (
    axis_at,
    clean_axis,
    einsum_axis,
    map_axis,
    operand_axis,
    permute_order,
    pieces,
    product_axes,
    rows_hold,
    softmax_axis,
    span,
    summed_width,
    swapped_axes,
    weights_summed_axis,
)
from harness.doctor.reading.masks import (
    Fill,
    added_mask,
    filled,
    provenance,
    sdpa_fill,
    spread,
)
from harness.doctor.reading.operands import (
    is_projection,
    normed_pieces,
    output_of,
    projected_input,
    rotated_source,
    rotation,
    value_projection,
    weight_name,
)
from harness.doctor.reading.ops import (
    ADD,
    CAPS,
    DIVIDE,
    FILL,
    LAYOUT,
    MULTIPLY,
    NORMS,
    PRODUCTS,
    SAME,
    SDPA,
    SOFTMAX,
    data_operand,
    from_input,
    is_clamp,
    multiplied,
    scalar,
    tensor_args,
    turned,
)
from harness.doctor.reading.pairing import mismatch, turned_in
from harness.doctor.reading.record import Op, Record, Value
from harness.doctor.reading.split import RESHAPES, positions_cut

# How the keys' axis is known when the product with V is not followed: a guess, which names
# no trap (q k^T puts the keys last; k q^T would not)
LAST_AXIS = "the last axis of the scores' product (a guess: the product with V was not followed)"


@dataclass
class Factor:
    """A constant the scores are multiplied by, where: "scores" (between the product and the
    softmax), "queries" or "keys" (on an operand of the product), "weights" (after the
    softmax)."""

    value: float
    where: str
    op: Op
    given: Value | None = None  # the argument that holds it (an attribute, a constant, ...)
    implicit: bool = False  # SDPA's own default, which no line of the module writes


@dataclass
class Site:
    """One attention found in the record, and what it computes."""

    softmax: Op
    product: Op | None = None  # the scores' product (None: an SDPA call, or not found)
    consumer: Op | None = None  # the product of the weights with the values
    weights_ref: int | None = None  # the op whose result the consumer takes as the weights
    ndim: int = 0  # the rank of the scores at the softmax
    softmax_axis: int | None = None
    key_axis: int | None = None
    query_axis: int | None = None
    key_axis_from: str = ""  # how the keys' axis is known
    width: int | None = None  # the width the scores' product sums over
    factors: list[Factor] = field(default_factory=list)
    complete: bool = False  # every factor back to the projections is read
    stopped_at: Op | None = None  # where reading the factors stopped, when not complete
    fills: list[Fill] = field(default_factory=list)
    caps: list[Op] = field(default_factory=list)
    sdpa: bool = False
    rank_raised: tuple[Op, tuple[int, ...], tuple[int, ...]] | None = None  # a mask's, and how
    merged_without_transpose: Op | None = None  # the reshape that cuts the queries' axis up
    split_without_transpose: Op | None = None  # the reshape that cuts an operand's positions up
    heads_for_positions: bool = False  # that op puts a piece of the features there instead
    rotated: Op | None = None  # where the queries or keys are rotated (q cos + rotate_half(q) sin)
    values_rotated: Op | None = None  # where the values are rotated as well (rope_on_value)
    turned_before: Op | None = None  # where the queries' or keys' input is turned, unprojected
    # a rotation whose cos table repeats its angles for the other pairing: (turn, table, where)
    pairing: tuple[str, str, Op, Op] | None = None
    # the parameter each of "queries", "keys", "values" and "output" is projected by, as read
    # back (forward, for the output) from the attention (None: not a parameter)
    projections: dict[str, str | None] = field(default_factory=dict)
    gate: Op | None = None  # where its output is multiplied by other data before its projection
    sdpa_mask: Tensor | None = None  # the attn_mask an SDPA call was given
    is_causal: bool = False
    values: Tensor | None = None  # the values the weights multiply, as recorded
    keys: Tensor | None = None  # the keys the queries multiply, as recorded (SDPA's, or k^T)
    normed: bool = False  # the queries or keys are normalized (the scale is read after it)
    # where "queries" and "keys" are rotated, and the pairing the turn keeps lengths in
    turns: dict[str, tuple[Op, str | None]] = field(default_factory=dict)

    def fill_axes(self, cells: Tensor) -> tuple[int, int] | None:
        """The queries' and keys' axes of a fill's cells, counted from the end as the scores'
        are (a mask added before a view that folds the heads into the batch has a rank of its
        own); None where they are not known."""
        q, k = self.query_axis, self.key_axis
        if q is None or k is None or q == k:
            return None
        fq, fk = q - self.ndim + cells.dim(), k - self.ndim + cells.dim()
        return None if min(fq, fk) < 0 else (fq, fk)

    def own_fills(self, mixed: bool = False) -> list[Fill]:
        """The fills the module made, whose cells are known; ``mixed``: then those that join
        the caller's mask to one it made (after its own: where a mask of the module's is
        located, its own comes first)."""
        known = [f for f in self.fills if f.cells is not None]
        own = [f for f in known if f.own]
        return own + [f for f in known if mixed and f.made_here and not f.own]

    def blocked(self, mixed: bool = False) -> Tensor | None:
        """(T_q, T_k): the cells the module's own fills together block in every batch and
        head (None: no fill of its own, or the axes are not known). ``mixed``: with the fills
        that join the caller's mask to one the module made (its window and the padding in
        one mask), whose cells blocked in every batch are the module's, as long as the first
        sequence (never padded by the doctor) is blocked only there: a caller's mask read the
        wrong way round blocks all of it."""
        q, k = self.query_axis, self.key_axis
        if q is None or k is None or q == k:
            return None
        slices = []
        for fill in self.own_fills(mixed):
            assert fill.cells is not None
            axes = self.fill_axes(fill.cells)
            if axes is None:
                continue
            rank, (fq, fk) = fill.cells.dim(), axes
            others = [a for a in range(rank) if a not in (fq, fk)]
            size = (fill.cells.shape[fq], fill.cells.shape[fk])
            each = fill.cells.permute(*others, fq, fk).reshape(-1, *size)  # (B h, T_q, T_k)
            if fill.own or torch.equal(each[0], each.all(0)):
                slices.append(each)
        if not slices or any(s.shape != slices[0].shape for s in slices):
            return None
        return torch.stack(slices).any(0).all(0)

    @property
    def scale(self) -> float:
        """The product of the constant factors on the scores and their operands."""
        return math.prod(f.value for f in self.factors if f.where != "weights")

    @property
    def after_softmax(self) -> list[Factor]:
        return [f for f in self.factors if f.where == "weights"]


def _elementwise(op: Op) -> bool:
    """An op that keeps its main operand's cells where they are (a scale, a mask, a cap)."""
    return (op.name in SAME | FILL | CAPS | MULTIPLY | DIVIDE | ADD or op.name in {"sub", "where"}
            or is_clamp(op))  # fmt: skip


def _read_scores(record: Record, site: Site, value: Value, memo: dict[int, bool]) -> None:
    """Follow the softmax's input back to the scores' product: factors, fills, caps, and
    where the softmax's axis and the product's axes meet."""
    path: list[Op] = []
    while (op := record.producer(value)) is not None and not _of_two(record, op, memo):
        if op.name in PRODUCTS:  # the scores times weights (talking heads): followed by letter
            data = [v for v in tensor_args(op) if from_input(record, v, memo)]
            if op.name != "einsum" or len(data) != 1:
                site.stopped_at = op
                return
            path.append(op)
            value = data[0]
            continue
        if not (_elementwise(op) or op.name in LAYOUT):
            site.stopped_at = op
            return
        path.append(op)
        before = len(site.fills)
        if op.name in MULTIPLY | DIVIDE:
            others = [v for v in tensor_args(op) + [v for v in op.args if not v.is_tensor]
                      if not from_input(record, v, memo)]  # fmt: skip
            for other in others:
                number = scalar(other)
                if number is not None and number != 0:
                    factor = 1 / number if op.name in DIVIDE else number
                    site.factors.append(Factor(factor, "scores", op, other))
                elif other.is_tensor and number is None:  # a factor per head, or learned
                    site.stopped_at = site.stopped_at or op  # (Swin V2's logit_scale): not read
        elif op.name in FILL:
            site.fills.append(filled(record, op))
            _rank_raised(record, site, op, memo)
        elif op.name in ADD | {"where"}:
            added = added_mask(record, op, memo)
            if added is not None:
                site.fills.append(added)
                _rank_raised(record, site, op, memo)
        elif op.name in CAPS:
            site.caps.append(op)
        main = data_operand(record, op, memo)
        if main is None:
            site.stopped_at = op
            return
        for fill in site.fills[before:]:
            fill.spread = spread(record.result(main), fill.cells)
        value = main
    site.product = op
    if op is None:
        return
    alpha = op.const(4, "alpha") if op.name == "baddbmm" else None
    if isinstance(alpha, int | float) and alpha not in (0, 1):  # baddbmm(..., alpha=scale)
        site.factors.append(Factor(float(alpha), "scores", op))
    adds = op.name == "baddbmm" and op.const(3, "beta", 1) != 0  # beta=0: the term is ignored
    added = added_mask(record, op, memo) if adds else None
    if added is not None:  # baddbmm(mask, q, k): the mask added to the product
        added.spread = spread(record.results[op.index][0], added.cells)
        site.fills.append(added)
    # the product's axes, carried through the path to the softmax's input
    shape = op.shapes[0] if op.shapes else ()
    ndim = len(shape)
    key, query = product_axes(op)
    runs: dict[str, tuple[int, int]] = {}  # an axis a reshape cut in pieces, as its run
    for step in reversed(path):
        out_shape = step.shapes[0] if step.shapes else shape
        out_ndim = len(out_shape)
        if step.name == "einsum":
            key, query = (None if a is None else einsum_axis(record, step, a, memo)
                          for a in (key, query))  # fmt: skip
        elif _elementwise(step):  # the same cells; a wider mask adds leading axes
            key, query = (None if a is None else a + out_ndim - ndim for a in (key, query))
        else:
            before = {"key": key, "query": query}
            key = None if key is None else map_axis(step, key, ndim)
            query = None if query is None else _query_after(step, query, key, ndim)
            if step.name in RESHAPES:
                runs |= {n: span(shape, a) for n, a in before.items() if a is not None}
                key, query = (
                    _whole_again(out_shape, runs, "key", key),
                    _whole_again(out_shape, runs, "query", query),
                )
        if step.name not in RESHAPES and (out_shape != shape or not _elementwise(step)):
            runs.clear()  # moved or broadcast: a run no longer says where the axis is
        shape, ndim = out_shape, out_ndim
    if site.key_axis is None and key is not None:
        site.key_axis, site.key_axis_from = key, LAST_AXIS
    # k q^T: the product with V sums over the first operand's axis, so the first is the keys
    swapped = key is not None and query is not None and site.key_axis == query != key
    site.query_axis = key if swapped else query
    site.width = summed_width(op)
    _read_operands(record, site, op, memo, swapped)


def _whole_again(
    shape: tuple[int, ...], runs: dict[str, tuple[int, int]], name: str, axis: int | None
) -> int | None:
    """Axis ``name`` after a reshape: ``axis`` where the reshape kept it whole; else the axis
    of ``shape`` that strides over its run again, where the reshape merged back the pieces an
    earlier one cut it into (SAM's decomposed position bias views the scores as
    (B, q_h, q_w, k_h, k_w) and back); else None, its run kept for a later reshape."""
    if axis is not None:
        runs.pop(name, None)
        return axis
    found = axis_at(shape, runs[name]) if name in runs else None
    if found is not None:
        del runs[name]
    return found


def _query_after(step: Op, query: int, key: int | None, ndim: int) -> int | None:
    """Where the queries' axis is after a layout op; where a reshape splits it in two (rows
    of each position's heads, ``(B, T * h, S) -> (B, T, h, S)``, multi-query's layout), the
    piece as long as the keys' axis (a self-attention's queries are), when one alone is."""
    moved = map_axis(step, query, ndim)
    if moved is not None or key is None or not step.shapes:
        return moved
    shape = step.shapes[0]
    same = [p for p in pieces(step, query) if shape[p] == shape[key]]
    return same[0] if len(same) == 1 else None


def _of_two(record: Record, op: Op, memo: dict[int, bool]) -> bool:
    """A product of two tensors that both depend on the input: q k^T, or weights times V (not
    data times a weight, which mixes heads or projects)."""
    if op.name not in PRODUCTS:
        return False
    return sum(from_input(record, v, memo) for v in multiplied(op)) >= 2


def _read_operands(record: Record, site: Site, product: Op, memo: dict[int, bool],
                   swapped: bool = False) -> None:  # fmt: skip
    """Constant factors on the product's two operands, back to their projections (a linear
    op or the input); rotary (a sum of the operand times two tables) is followed through.
    ``swapped``: the product is k q^T."""
    tensors = multiplied(product)
    if len(tensors) > 1 and product.name != "einsum":  # q @ k^T: heads on the same axis
        site.keys = record.result(tensors[1])
    complete = True
    roles = ("keys", "queries") if swapped else ("queries", "keys")
    for value, where in zip(tensors[:2], roles, strict=False):
        complete &= _read_operand(record, site, value, where, memo)
    if product.name != "einsum":  # a @ b: a's positions on its axis -2, b's on its last
        for value, from_end in zip(tensors[:2], (2, 1), strict=False):
            _split(record, site, value, from_end, memo)
    else:  # by letter: the queries' in the first operand, the keys' in the second
        key, query = product_axes(product)
        for i, (value, axis) in enumerate(zip(tensors[:2], (query, key), strict=False)):
            at = operand_axis(product, i, axis) if axis is not None else None
            if at is not None and value.shape is not None:
                _split(record, site, value, len(value.shape) - at, memo)
    site.complete = complete and site.stopped_at is None


def _split(record: Record, site: Site, value: Value, from_end: int, memo: dict) -> None:
    """Whether the operand ``value`` (its positions on its axis ``-from_end``) had its heads
    split by a reshape that cut its positions up: the first such reshape is kept."""
    if value.shape is not None and len(value.shape) >= from_end:
        axis = len(value.shape) - from_end
        found = positions_cut(record, value, axis, memo)
        if found is not None and site.split_without_transpose is None:
            site.split_without_transpose, site.heads_for_positions = found


# a statistic of the data a normalization divides it by (or multiplies by the inverse of)
STATISTICS = {"rsqrt", "reciprocal", "norm", "linalg_vector_norm", "sqrt", "std"}


def _normalizes(record: Record, op: Op, memo: dict, depth: int = 0) -> bool:
    """``op`` is a normalization's last step (a norm op, x * rsqrt(mean(x^2)), x / ||x||, or
    a learned per-channel weight times one): whatever scaled the data before it is undone, so
    the scale is read from here on."""
    if op.name in NORMS or (op.name in {"cat", "stack"} and normed_pieces(record, op.tensors)):
        return True  # a norm, or heads normalized one by one and joined again
    if depth > 2 or op.name not in MULTIPLY | DIVIDE:
        return False
    tensors = tensor_args(op)
    divisor = tensors[1:] if op.name in DIVIDE else tensors
    for v in divisor:
        if not from_input(record, v, memo):
            continue  # a statistic of constants (DeBERTa's sqrt(d * 3)) is a scale, not a norm
        step = record.producer(v)
        for _ in range(3):  # through an epsilon added, a clamp, a cast
            if step is None or step.name in STATISTICS:
                break
            if step.name not in ADD | SAME | {"clamp", "clamp_min", "clamp_"}:
                step = None
                break
            step = record.producer(step.tensors[0]) if step.tensors else None
        if step is not None and step.name in STATISTICS:
            return True
    if op.name in MULTIPLY and any(v.kind == "parameter" for v in op.args):  # the norm's weight
        data = data_operand(record, op, memo)
        first = record.producer(data) if data is not None else None
        while first is not None and first.name in SAME:
            first = record.producer(first.tensors[0]) if first.tensors else None
        return first is not None and _normalizes(record, first, memo, depth + 1)
    return False


def _read_operand(record: Record, site: Site, value: Value, where: str, memo: dict) -> bool:
    """Follow one operand of the scores back to its projection: its constant factors, and the
    rotation on the way. Past a normalization (qk-norm) the factors met are undone by it, so
    only the rotation is still looked for, and the operand counts as read whole."""
    steps, normed = 0, False
    while (op := record.producer(value)) is not None and steps < 64:
        steps += 1
        if is_projection(record, op, memo):
            site.projections[where] = weight_name(record, op, memo)
            data = projected_input(op)
            if data is not None and site.turned_before is None:  # the input turned first
                site.turned_before = rotation(record, data, memo, projected=True)
            return True  # a projection: the operand starts here
        if _normalizes(record, op, memo):  # each of its steps: a weight, x * rsqrt(...)
            site.normed = normed = True  # the factors after it are the whole scale
            main = data_operand(record, op, memo) if op.name not in NORMS else op.args[0]
            if main is None or not main.is_tensor:
                return True
            value = main
            continue
        if turned(record, op, memo):
            site.rotated = site.rotated or op
        elif op.name in MULTIPLY | DIVIDE:
            given = next((v for v in op.args if not from_input(record, v, memo)
                          and scalar(v) is not None), None)  # fmt: skip
            number = scalar(given) if given is not None else None
            if number is not None and number != 0:
                if not normed:
                    factor = 1 / number if op.name in DIVIDE else number
                    site.factors.append(Factor(factor, where, op, given))
            elif any(v.kind == "parameter" for v in op.args):
                break  # a learned factor: its value is the training's, not read here
            elif not any(v.is_tensor and not from_input(record, v, memo) for v in op.args):
                break  # data times data: not a scale
        elif op.name in ADD | {"sub", "cat", "stack"}:
            source = rotated_source(record, op, memo)
            if source is None:
                break
            site.rotated = site.rotated or op
            site.pairing = site.pairing or mismatch(record, op, memo)
            site.turns.setdefault(where, (op, turned_in(record, op, source, memo)))
            value = source
            continue
        elif op.name == "__setitem__":  # q[..., :d] = q_nope; q[..., d:] = q_pe: a piece
            written = op.args[2] if len(op.args) > 2 else None
            if written is None or not written.is_tensor or not from_input(record, written, memo):
                break
            value = written  # the last piece written, read as the whole's
            continue
        elif not (op.name in SAME or op.name in LAYOUT or op.name in {"neg", "__neg__"}):
            break
        main = data_operand(record, op, memo)
        if main is None:
            break
        value = main
    else:
        return normed or value.kind == "input"  # the operand is the input itself
    if normed:
        return True
    site.stopped_at = site.stopped_at or op
    return False


def _rank_raised(record: Record, site: Site, op: Op, memo: dict[int, bool]) -> None:
    """A mask of more axes than the scores, which broadcasting gives its rank to them (a
    (B, 1, T, T) mask on (B, T, T) scores: (B, B, T, T), every batch against every other)."""
    main = data_operand(record, op, memo)
    known = main is not None and main.shape is not None and op.shapes
    if known and len(op.shapes[0]) > len(main.shape) and site.rank_raised is None:
        site.rank_raised = (op, main.shape, op.shapes[0])


FOLLOWED = {"transpose", "swapaxes", "permute", "where", "nan_to_num"}


def _follows(op: Op) -> bool:
    """An op the weights are followed through to their product with the values."""
    return op.name in PRODUCTS | MULTIPLY | DIVIDE | SAME | FILL | FOLLOWED


def _read_weights(record: Record, site: Site, memo: dict[int, bool]) -> None:
    """Follow the weights forward to their product with the values: the axis it sums over is
    the keys' axis (carried back through transposes on the way); constant factors on the way
    are applied after the softmax."""
    index = site.softmax.index
    axes = list(range(site.ndim))  # axes[i]: the weights' axis now at position i
    for _ in range(16):
        taken = list(record.consumers(index))  # a view kept for the weights returned aside
        nxt = next((c for c in taken if _follows(c)), taken[0] if taken else None)
        if nxt is None:
            return
        if nxt.name in PRODUCTS and not _of_two(record, nxt, memo):
            if nxt.name != "einsum":
                return  # weights times a weight, not the values: the keys' axis stays the scores'
            moved = [einsum_axis(record, nxt, i, memo) for i in range(len(axes))]
            placed: list[int | None] = [None] * (len(nxt.shapes[0]) if nxt.shapes else 0)
            for original, position in zip(axes, moved, strict=True):
                if position is not None and original is not None:
                    placed[position] = original
            axes = placed  # type: ignore[assignment]
            index = nxt.index
            continue
        if nxt.name in PRODUCTS:
            site.consumer, site.weights_ref = nxt, index
            position = next(i for i, v in enumerate(multiplied(nxt))
                            if v.kind == "op" and v.ref == index)  # fmt: skip
            summed = weights_summed_axis(nxt, position, len(axes))
            if summed is not None and axes[summed] is not None:
                site.key_axis, site.key_axis_from = (
                    axes[summed],
                    "the axis the product with V sums over",
                )
            return
        if nxt.name in MULTIPLY | DIVIDE:
            for v in nxt.args:
                number = scalar(v) if not from_input(record, v, memo) else None
                if number is not None and number != 0:
                    factor = 1 / number if nxt.name in DIVIDE else number
                    site.factors.append(Factor(factor, "weights", nxt, v))
        elif nxt.name in {"transpose", "swapaxes"}:
            pair = swapped_axes(nxt, len(axes))
            if pair is None:
                return
            a, b = pair
            axes[a], axes[b] = axes[b], axes[a]
        elif nxt.name == "permute":
            order = permute_order(nxt, len(axes))
            if order is None:
                return
            axes = [axes[o] for o in order]
        elif not _follows(nxt):
            return  # a change of layout it does not follow: the keys' axis stays the scores'
        index = nxt.index


def sites(record: Record) -> list[Site]:
    """Every attention in the record: each softmax over scores that a product made, and
    each SDPA call."""
    memo: dict[int, bool] = {}
    found = []
    for op in record.ops:
        if op.name in SDPA:
            found.append(_sdpa_site(record, op, memo))
            continue
        if op.name not in SOFTMAX or not op.args or op.args[0].shape is None:
            continue
        site = Site(op, ndim=len(op.args[0].shape))
        site.softmax_axis = softmax_axis(op, site.ndim)
        _read_weights(record, site, memo)
        _read_scores(record, site, op.args[0], memo)
        for fill in site.fills:
            provenance(record, fill)
        if site.consumer is not None and site.query_axis is not None:
            first = tensor_args(site.consumer)[0]
            if first.kind == "op" and first.ref == site.weights_ref:  # weights @ V: queries stay
                _merged(record, site, site.consumer, _query_in_output(site))
        if site.consumer is not None:
            values = [v for v in tensor_args(site.consumer)
                      if not (v.kind == "op" and v.ref == site.weights_ref)]  # fmt: skip
            if len(values) == 1 and from_input(record, values[0], memo):
                site.values = record.result(values[0])
                weights_first = tensor_args(site.consumer)[0].ref == site.weights_ref
                from_end = 2 if weights_first else 1  # V's positions, (..., S, d) for a matmul
                if site.consumer.name == "einsum":  # the letter the weights sum over
                    at = operand_axis(site.consumer, 1 if weights_first else 0)
                    shape = values[0].shape
                    from_end = len(shape) - at if at is not None and shape is not None else 0
                if from_end:
                    _split(record, site, values[0], from_end, memo)
                site.values_rotated = rotation(record, values[0], memo)
                site.projections["values"] = value_projection(record, values[0], memo)
            site.projections["output"], site.gate = output_of(record, site.consumer.index, memo)
        if site.product is not None or site.consumer is not None:
            found.append(site)
    return found


def _query_in_output(site: Site) -> int | None:
    """The queries' axis of the weights-times-values product's result: where it was in the
    weights for a matmul, by its letter for an einsum."""
    consumer, query = site.consumer, site.query_axis
    if consumer is None or query is None or consumer.name != "einsum":
        return query
    spec = consumer.const(0, "equation")
    if not isinstance(spec, str) or "->" not in spec or "." in spec:
        return None
    inputs, output = spec.replace(" ", "").split("->")
    weights = inputs.split(",")[0]
    if query >= len(weights) or weights[query] not in output:
        return None
    return output.index(weights[query])


def _merged(record: Record, site: Site, start: Op, query: int | None) -> None:
    """Follow the attention's output (queries on axis ``query``) through the layout ops that
    merge its heads; a reshape that cuts the queries' axis up, mixing it with the heads before
    it, is heads merged without the transpose."""
    index = start.index
    for _ in range(8):
        if query is None:
            return
        nxt = next(record.consumers(index), None)
        if nxt is None or not nxt.shapes or not nxt.args or nxt.args[0].shape is None:
            return
        shape_in = nxt.args[0].shape
        if nxt.name in {"transpose", "swapaxes"}:
            query = map_axis(nxt, query, len(shape_in))
        elif nxt.name in {"view", "reshape", "flatten"}:
            landed = clean_axis(shape_in, nxt.shapes[0], query)
            if landed == -1 and not rows_hold(shape_in, nxt.shapes[0], query):
                site.merged_without_transpose = nxt
                return
            query = landed
        elif nxt.name not in SAME:
            return
        index = nxt.index


def _sdpa_spread(record: Record, op: Op, blocked: Tensor | None) -> float | None:
    """The spread of an SDPA call's scores, q k^T times its scale, over the cells its mask
    keeps; None where q and k do not multiply as they are (K/V heads SDPA itself repeats)."""
    query, key = (record.result(v) if v is not None else None
                  for v in (op.arg(0, "query"), op.arg(1, "key")))  # fmt: skip
    if query is None or key is None or query.shape[:-2] != key.shape[:-2]:
        return None
    scale = op.const(6, "scale")
    scale = scale if isinstance(scale, int | float) else 1 / math.sqrt(query.shape[-1])
    return spread(query.double() @ key.double().transpose(-2, -1) * scale, blocked)


def _sdpa_site(record: Record, op: Op, memo: dict[int, bool]) -> Site:
    """An SDPA call: its keys are on the last axis by contract; its scale is its ``scale``
    argument (else 1/sqrt of the queries' width) times the factors on q and k."""
    query = op.arg(0, "query")
    ndim = len(query.shape) if query is not None and query.shape else 0
    site = Site(op, ndim=ndim, softmax_axis=ndim - 1, key_axis=ndim - 1, sdpa=True,
                key_axis_from="SDPA's contract")  # fmt: skip
    site.width = query.shape[-1] if query is not None and query.shape else None
    site.query_axis = ndim - 2
    _merged(record, site, op, ndim - 2)
    mask = op.arg(3, "attn_mask")
    site.sdpa_mask = record.result(mask) if mask is not None and mask.is_tensor else None
    value = op.arg(2, "value")
    site.values = record.result(value) if value is not None and value.is_tensor else None
    key = op.arg(1, "key")
    site.keys = record.result(key) if key is not None and key.is_tensor else None
    if site.sdpa_mask is not None and query is not None and query.shape and key and key.shape:
        scores = (*query.shape[:-1], key.shape[-2])  # (B, h, T, S)
        site.fills.append(sdpa_fill(record, op, mask, site.sdpa_mask, scores))
        site.fills[-1].spread = _sdpa_spread(record, op, site.fills[-1].cells)
        provenance(record, site.fills[-1])
    site.is_causal = bool(op.const(5, "is_causal", False))
    scale = op.const(6, "scale")
    if isinstance(scale, int | float):
        site.factors.append(Factor(float(scale), "scores", op))
    elif site.width:
        site.factors.append(Factor(1 / math.sqrt(site.width), "scores", op, implicit=True))
    complete = True
    for value, where in zip((op.arg(0, "query"), op.arg(1, "key")), ("queries", "keys"),
                            strict=True):  # fmt: skip
        if value is not None:
            complete &= _read_operand(record, site, value, where, memo)
    for value in (op.arg(0, "query"), op.arg(1, "key"), op.arg(2, "value")):
        if value is not None and value.is_tensor:
            _split(record, site, value, 2, memo)  # (..., T, d): positions on axis -2
    site.complete = complete
    value = op.arg(2, "value")
    if value is not None and value.is_tensor and from_input(record, value, memo):
        site.values_rotated = rotation(record, value, memo)
        site.projections["values"] = value_projection(record, value, memo)
    site.projections["output"], site.gate = output_of(record, op.index, memo)
    return site
