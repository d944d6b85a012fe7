"""Which dimensions a rotary embedding turns together, read from its values: a rotation
``q cos + r sin`` pairs dimension i with i + d/2 (``rotate_half``: r = (-q2, q1)) or 2i with
2i + 1 (``rotate_every_two``), and its cos table must repeat each angle the same way
(``cat((f, f))`` for halves, ``repeat_interleave(f, 2)`` for pairs). A table laid out for the
other pairing turns each dimension by another dimension's angle: no rotation at all."""

from __future__ import annotations

import torch
from torch import Tensor

from harness.doctor.reading.ops import MULTIPLY, from_input, tensor_args
from harness.doctor.reading.record import Op, Record, Value

HALVES, PAIRS = "halves (i, i + d/2)", "pairs (2i, 2i + 1)"
REPEATS = frozenset({"cat", "repeat_interleave", "stack", "repeat", "flatten", "tile"})


def _turned(q: Tensor, r: Tensor) -> str | None:
    """How ``r`` is ``q`` turned a quarter, pair by pair (up to the sign)."""
    d = q.shape[-1]
    if d % 2 or r.shape != q.shape:
        return None
    halves = torch.cat((-q[..., d // 2 :], q[..., : d // 2]), dim=-1)
    pairs = torch.stack((-q[..., 1::2], q[..., 0::2]), dim=-1).flatten(-2)
    for name, turned in ((HALVES, halves), (PAIRS, pairs)):
        if torch.allclose(r, turned) or torch.allclose(r, -turned):
            return name
    return None


def _repeated(table: Tensor) -> set[str]:
    """The pairings a table's angles are repeated for."""
    d = table.shape[-1]
    found = set()
    if d % 2 == 0 and torch.equal(table[..., : d // 2], table[..., d // 2 :]):
        found.add(HALVES)
    if d % 2 == 0 and torch.equal(table[..., 0::2], table[..., 1::2]):
        found.add(PAIRS)
    return found


def _made(record: Record, value: Value) -> Op | None:
    """The op that repeated a table's angles (a cat, a repeat_interleave), followed back."""
    for _ in range(16):
        op = record.producer(value)
        if op is None:
            return None
        if op.name in REPEATS and op.line:
            return op
        earlier = [v for v in op.tensors if v.kind == "op"]
        if not earlier:
            return None
        value = earlier[0]
    return None


def _read_at(record: Record, value: Value) -> Op | None:
    """Where the module's own code reads a table it holds (``cos_cached[position_ids]``),
    followed back from the rotation: the op that reads the buffer, else the last op of its
    code on the way."""
    found = None
    for _ in range(16):
        op = record.producer(value)
        if op is None:
            return found
        found = op if op.line else found
        if any(v.kind in ("buffer", "attribute") for v in op.tensors):
            return found
        earlier = [v for v in op.tensors if v.kind == "op"]
        if len(earlier) != 1:
            return found
        value = earlier[0]
    return found


def mismatch(
    record: Record, op: Op, memo: dict[int, bool], depth: int = 0
) -> tuple[str, str, Op, Op] | None:
    """A rotation ``op`` (a sum of the data and its turn, each times a table; or a cat of it
    with the dimensions left unturned, as partial rotary makes) whose cos or sin table repeats
    its angles for the other pairing than the turn's: the turn's pairing, the table's, where
    the table's angles were repeated, and where the data was turned (``rotate_half``)."""
    if op.name == "cat" and depth < 2:
        parts = (record.producer(v) for v in op.tensors)
        found = (mismatch(record, p, memo, depth + 1) for p in parts if p is not None)
        return next((f for f in found if f is not None), None)
    products = [record.producer(v) for v in op.tensors]
    terms = []  # (data, table) of each product
    for product in products:
        if product is None or product.name not in MULTIPLY:
            return None
        data = [v for v in tensor_args(product) if from_input(record, v, memo)]
        tables = [v for v in tensor_args(product) if not from_input(record, v, memo)]
        if len(data) != 1 or len(tables) != 1:
            return None
        terms.append((data[0], tables[0]))
    if len(terms) != 2:
        return None
    values = [(record.result(d), record.result(t)) for d, t in terms]
    if any(d is None or t is None for d, t in values):
        return None
    for i in (0, 1):
        (q, _), (r, _) = values[i], values[1 - i]
        turn = _turned(q, r)  # type: ignore[arg-type]
        if turn is None:
            continue
        for j in (i, 1 - i):  # the cos table, then the sin table
            table = _repeated(values[j][1])  # type: ignore[arg-type]
            # where its angles were repeated; for a table the module made before the call (a
            # buffer), where the forward reads it
            made = _made(record, terms[j][1]) or _read_at(record, terms[j][1]) or op
            if table and turn not in table:
                turned = record.producer(terms[1 - i][0]) or op
                return turn, table.pop(), made, turned
        return None
    return None


DECLARED = {"half": HALVES, "interleaved": PAIRS}  # --rope-pairing's words for each


def turned_in(record: Record, op: Op, source: Value, memo: dict[int, bool]) -> str | None:
    """The pairing a rotation ``op`` of ``source`` turns the dimensions in, read from its values:
    a turn keeps each pair's length (x_i^2 + x_j^2 = y_i^2 + y_j^2, whatever the angle), which
    the other pairing does not. Only the dimensions it changes are read (partial rotary); the
    rotation's result is taken where it lays the source's cells out again (a stack of the
    turned pairs, flattened). The pairing is said of the dimensions as the projection laid
    them out, where they were reordered on the way (DeepSeek lays pairs out as halves before
    it turns halves: pairs, as projected). None where neither pairing, or both, keep the
    lengths."""
    given = _turned_data(record, op, memo)
    for value in (given, source) if given is not None else (source,):
        taken = record.result(value)
        y = _laid_back(record, op, taken.numel()) if taken is not None else None
        if taken is None or y is None or not taken.is_floating_point():
            continue
        x, y = taken.detach().double().reshape(y.shape), y.detach().double()  # heads: a view
        changed = ((x - y).abs() > 1e-9 * (1 + x.abs())).flatten(0, -2).any(0).nonzero().flatten()
        if changed.numel() < 2:
            continue
        start, stop = int(changed[0]), int(changed[-1]) + 1
        width = stop - start + (stop - start) % 2
        x, y = x[..., start : start + width], y[..., start : start + width]
        if x.shape[-1] != width:
            continue
        i = torch.arange(width)
        found = [
            (name, partner)
            for name, partner in ((HALVES, (i + width // 2) % width), (PAIRS, i ^ 1))
            if torch.allclose(x**2 + x[..., partner] ** 2, y**2 + y[..., partner] ** 2, rtol=1e-6)
        ]
        if len(found) != 1:
            continue
        name, partner = found[0]
        earlier = _laid_from(record, value, taken)  # the dimensions as projected, if reordered
        same = earlier is not None and earlier.shape[-1] == y.shape[-1]
        moved = _columns(taken, earlier) if same and earlier is not None else None
        return name if moved is None else _pairing(moved[start + i], moved[start + partner])
    return None


def _turned_data(record: Record, op: Op, memo: dict[int, bool]) -> Value | None:
    """What a rotation ``q cos + turn(q) sin`` turns, as it takes it: the data of one of its
    two products whose turn is the other's (None: not two such products)."""
    data = []
    for product in (record.producer(v) for v in op.tensors):
        if product is None or product.name not in MULTIPLY:
            return None
        data += [v for v in tensor_args(product) if from_input(record, v, memo)][:1]
    if len(data) != 2:
        return None
    q, r = (record.result(v) for v in data)
    if q is None or r is None:
        return None
    if _turned(q, r) is not None:
        return data[0]
    return data[1] if _turned(r, q) is not None else None


# ops that lay a tensor's values out again, each value once, in another order
REORDERS = frozenset({"transpose", "permute", "view", "reshape", "unsqueeze", "squeeze",
                      "flatten", "unflatten", "swapaxes", "movedim", "contiguous", "mT",
                      "view_as", "reshape_as"})  # fmt: skip


def _laid_from(record: Record, source: Value, x: Tensor) -> Tensor | None:
    """The earliest tensor that ``source`` (recorded as ``x``) lays out again (views, transposes
    and reshapes back) with a last axis as wide as its own: the layout the projection gave the
    dimensions, which a model may reorder before its rotation (DeepSeek's pairs laid out as
    halves)."""
    earliest, value = None, source
    for _ in range(16):
        op = record.producer(value)
        if op is None or op.name not in REORDERS or not op.args:
            break
        value = op.args[0]
        laid = record.result(value)
        if laid is None or laid.numel() != x.numel():
            break
        if laid.shape[-1] == x.shape[-1]:
            earliest = laid
    return earliest


def _columns(x: Tensor, earlier: Tensor) -> Tensor | None:
    """For each dimension of ``x``'s last axis, the dimension of ``earlier``'s that holds its
    values (None where they are not one dimension each: values that repeat, another shape)."""
    if x.shape[-1] != earlier.shape[-1] or x.numel() != earlier.numel():
        return None
    flat = earlier.detach().double().reshape(-1)
    order = flat.argsort()
    ranked = flat[order]
    if bool((ranked[1:] == ranked[:-1]).any()):
        return None  # a value held twice: its dimension is not told apart
    values = x.detach().double().reshape(-1, x.shape[-1]).contiguous()
    at = torch.searchsorted(ranked, values).clamp(max=ranked.numel() - 1)
    if not torch.equal(ranked[at], values):
        return None
    columns = order[at] % earlier.shape[-1]  # (N, d)
    if not bool((columns == columns[:1]).all()):
        return None
    return columns[0]


def _pairing(first: Tensor, second: Tensor) -> str | None:
    """The pairing of dimensions ``first[n]`` and ``second[n]``, turned together, counted from
    the first dimension they span."""
    low = int(torch.minimum(first, second).min())
    width = int(torch.maximum(first, second).max()) - low + 1
    a, b = first - low, second - low
    if width % 2 == 0 and bool((b == (a + width // 2) % width).all()):
        return HALVES
    if bool((b == a ^ 1).all()):
        return PAIRS
    return None


def _laid_back(record: Record, op: Op, size: int) -> Tensor | None:
    """The rotation's result, or where a consumer or two lays it out again as its source's
    ``size`` cells along a last axis of dimensions (not a stack's (..., d/2, 2) of pairs)."""
    index = op.index
    for _ in range(3):
        result = record.results[index][0] if record.results[index] else None
        if result is not None and result.numel() == size and result.shape[-1] > 2:
            return result
        nxt = next(record.consumers(index), None)
        if nxt is None:
            return None
        index = nxt.index
    return None
