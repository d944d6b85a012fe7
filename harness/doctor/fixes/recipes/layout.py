"""Recipes for the traps of axes: the softmax's, the keys' transpose, heads split or merged, K/V
heads grouped, and a mask laid along the wrong axis or rank."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TypeVar

import libcst as cst

from harness.doctor.fixes.line import (
    Line,
    argument,
    called,
    parenthesized,
    positional,
    with_argument,
)
from harness.doctor.fixes.recipes.terms import MADE, SOFTMAX, literal, untransposed

Item = TypeVar("Item")  # an element of a list two places of which are swapped


SOFTMAX_LAYERS = ("Softmax", "LogSoftmax")
MERGE = ("reshape", "view")


def softmax_dim(line: Line) -> Iterator[str]:
    """``softmax(scores)`` without ``dim``, or over another axis: over the last, the keys'
    (``nn.Softmax(dim=1)``, made where the forward's ``self.softmax`` is, too)."""
    for call in line.calls(*SOFTMAX):
        position = 1 if line.is_function_form(call) else 0
        yield line.replaced(call, with_argument(call, position, "dim", "-1"))
    for call in line.calls(*SOFTMAX_LAYERS):
        yield line.replaced(call, with_argument(call, 0, "dim", "-1"))


def gqa_kv_grouping(line: Line) -> Iterator[str]:
    """Grouped K/V heads tiled (``k.repeat(1, n_rep, 1, 1)``): each repeated in place on that
    axis (``k.repeat_interleave(n_rep, dim=1)``), every such tiling in the function at once
    (keys and values are grouped alike)."""
    changes = {}
    for call in line.in_function(cst.Call):
        if called(call) != "repeat" or line.is_function_form(call):  # type: ignore[arg-type]
            continue
        sizes = positional(call)  # type: ignore[arg-type]
        grown = [i for i, a in enumerate(sizes) if line.code(a.value).strip() != "1"]
        if len(sizes) < 3 or len(grown) != 1:
            continue
        axis = grown[0]
        interleaved = f"{line.code(call.func.value)}.repeat_interleave("  # type: ignore[attr-defined]
        interleaved += f"{line.code(sizes[axis].value)}, dim={axis})"
        changes[call] = cst.parse_expression(interleaved)
    if changes:
        yield line.replaced_all(changes)
    yield from _expanded_in_blocks(line)
    yield from _group_turned(line)


def _group_turned(line: Line) -> Iterator[str]:
    """An einops pattern that copies the K/V heads into a group of two axes (``'b h n d ->
    b (h r) n d'``, blocks): the group's order turned (``(r h)``, strided), and back."""
    for string, given, result in _patterns(line):
        for group in re.findall(r"\(\s*(\w+)\s+(\w+)\s*\)", result):
            turned = result.replace(f"({group[0]} {group[1]})", f"({group[1]} {group[0]})", 1)
            if turned != result:
                yield _repatterned(line, string, f"{given}->{turned}")


def _expanded_in_blocks(line: Line) -> Iterator[str]:
    """K/V heads tiled by a new axis expanded before the heads' (``x[:, None].expand(b, n_rep,
    kv, ...)``): the new axis and its size moved after the heads (``x[:, :, None].expand(b,
    kv, n_rep, ...)``), so each head's copies lie together."""
    for call in line.calls("expand"):
        receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
        sizes = positional(call)
        if isinstance(receiver, cst.Call) and not line.is_function_form(call):
            yield from _unsqueezed_in_blocks(line, call, receiver, sizes)
        if not isinstance(receiver, cst.Subscript) or line.is_function_form(call):
            continue
        elements = list(receiver.slice)
        new = [i for i, e in enumerate(elements) if _new_axis(line, e)]
        if len(new) != 1 or len(sizes) != len(elements):
            continue
        at = new[0]
        for other in (at + 1, at - 1):
            if not 0 <= other < len(elements) or _new_axis(line, elements[other]):
                continue
            index = receiver.with_changes(slice=_commas(_swapped(elements, at, other)))
            turned = _swapped(sizes, at, other)
            args = [a.with_changes(comma=s.comma) for a, s in zip(turned, sizes, strict=True)]
            yield line.replaced(
                call, call.with_changes(func=call.func.with_changes(value=index), args=args)
            )  # type: ignore[attr-defined]


def _unsqueezed_in_blocks(
    line: Line, call: cst.Call, unsqueezed: cst.Call, sizes: list[cst.Arg]
) -> Iterator[str]:
    """``t.unsqueeze(-3).expand(-1, -1, n_rep, -1, -1)``, the copies' axis before the heads':
    that axis and its size moved one place each way (``t.unsqueeze(-2).expand(-1, -1, -1,
    n_rep, -1)``)."""
    given = positional(unsqueezed)
    dim = literal(given[0].value) if called(unsqueezed) == "unsqueeze" and given else None
    if dim is None or line.is_function_form(unsqueezed):
        return
    at = dim + len(sizes) if dim < 0 else dim
    for other in (at + 1, at - 1):
        if not 0 <= other < len(sizes):
            continue
        moved = str(other - len(sizes) if dim < 0 else other)
        axis = given[0].with_changes(value=cst.parse_expression(moved))
        receiver = unsqueezed.with_changes(args=[axis, *unsqueezed.args[1:]])
        turned = _swapped(sizes, at, other)
        args = [a.with_changes(comma=s.comma) for a, s in zip(turned, sizes, strict=True)]
        func = call.func.with_changes(value=receiver)  # type: ignore[attr-defined]
        yield line.replaced(call, call.with_changes(func=func, args=args))


def _new_axis(line: Line, element: cst.SubscriptElement) -> bool:
    """``None`` in an index (``m[:, None]``): an axis of size 1 added there."""
    return isinstance(element.slice, cst.Index) and line.code(element.slice.value) == "None"


def mask_rank(line: Line) -> Iterator[str]:
    """A mask made with more axes than the scores it fills: one axis fewer, each way the line
    adds one (a leading size 1 of ``torch.ones(1, 1, T, T)``, a ``None`` of ``m[:, None]``,
    an ``unsqueeze``); the proof finds the one that lays it out as the scores."""
    for call in line.calls(*MADE):
        sizes = positional(call)
        if len(sizes) > 2 and line.code(sizes[0].value).strip() == "1":
            kept = [a for a in call.args if a is not sizes[0]]
            yield line.replaced(call, call.with_changes(args=kept))
    for index in line.nodes(cst.Subscript):
        elements = index.slice  # type: ignore[attr-defined]
        for element in elements:
            if _new_axis(line, element):
                kept = [e for e in elements if e is not element]
                kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                yield line.replaced(index, index.with_changes(slice=kept))
    for call in line.calls("unsqueeze"):
        if isinstance(call.func, cst.Attribute):
            yield line.replaced(call, call.func.value)


def padding_on_queries(line: Line) -> Iterator[str]:
    """A padding mask laid along the queries (``mask[:, :, None]``): its new axis moved to
    each other place, nearest first (``mask[:, None, :]``), so that it runs along the keys;
    with several new axes (``mask[:, None, :, None]``), the last one swapped with the data
    axis beside it (``mask[:, None, None, :]``), then the last data axis moved to each other
    place after the first (``mask[:, :, None, None]`` to ``mask[:, None, None, :]``)."""
    for index in line.nodes(cst.Subscript):
        elements = list(index.slice)  # type: ignore[attr-defined]
        new = [e for e in elements if _new_axis(line, e)]
        if not new or len(elements) < 3:
            continue
        at = elements.index(new[-1])
        if len(new) == 1:
            others = [e for e in elements if e is not new[0]]
            places = sorted(set(range(len(elements))) - {at}, key=lambda p: abs(p - at))
            orders = [[*others[:p], new[0], *others[p:]] for p in places]
        else:
            beside = [p for p in (at - 1, at + 1) if 0 <= p < len(elements)]
            orders = [_swapped(elements, at, p) for p in beside if elements[p] not in new]
            data = max(elements.index(e) for e in elements if e not in new)
            rest = elements[:data] + elements[data + 1 :]  # the last data axis moved instead
            places = sorted(set(range(1, len(elements))) - {data}, key=lambda p: abs(p - data))
            orders += [[*rest[:p], elements[data], *rest[p:]] for p in places]
        for moved in orders:
            yield line.replaced(index, index.with_changes(slice=_commas(moved)))
    yield from _pattern_axis_moved(line)
    yield from _unsqueezed_one_off(line)
    yield from _shape_one_off(line)
    yield from untransposed(line)  # the mask turned onto the queries: as it was


def _swapped(items: list[Item], a: int, b: int) -> list[Item]:
    swapped = list(items)
    swapped[a], swapped[b] = items[b], items[a]
    return swapped


def _commas(elements: list[cst.SubscriptElement]) -> list[cst.SubscriptElement]:
    """``elements`` as an index, each followed by ", " but the last."""
    last = len(elements) - 1
    return [e.with_changes(comma=cst.MaybeSentinel.DEFAULT if i == last else
                           cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            for i, e in enumerate(elements)]  # fmt: skip


NEW_AXIS = ("()", "1")  # an axis of size one in an einops pattern


def _patterns(line: Line) -> Iterator[tuple[cst.SimpleString, str, str]]:
    """Each einops pattern on the line (a string with one ``->``): the string, and the text
    before and after the arrow."""
    for string in line.nodes(cst.SimpleString):
        text = string.evaluated_value  # type: ignore[attr-defined]
        if isinstance(text, str) and text.count("->") == 1:
            given, result = text.split("->")
            yield string, given, result  # type: ignore[misc]


def _repatterned(line: Line, string: cst.SimpleString, pattern: str) -> str:
    """The whole source with the einops pattern ``string`` written as ``pattern``, in the
    string's own quotes and prefix."""
    quote = string.quote
    return line.replaced(string, cst.SimpleString(f"{string.prefix}{quote}{pattern}{quote}"))


def _pattern_axis_moved(line: Line) -> Iterator[str]:
    """An einops pattern whose result has one new axis (``'b j -> (b h) j ()'``): that axis
    moved to each other place of the result, nearest first (``'b j -> (b h) () j'``)."""
    for string, given, result in _patterns(line):
        axes = re.findall(r"\([^()]*\)|\S+", result)
        new = [i for i, a in enumerate(axes) if a.replace(" ", "") in NEW_AXIS]
        if not new or len(axes) < 3:
            continue
        at = new[-1]
        if len(new) == 1:
            others = axes[:at] + axes[at + 1 :]
            places = sorted(set(range(len(axes))) - {at}, key=lambda p: abs(p - at))
            orders = [[*others[:place], axes[at], *others[place:]] for place in places]
        else:  # as an index with several new axes: the last swapped with the data beside it
            beside = [p for p in (at - 1, at + 1) if 0 <= p < len(axes) and p not in new]
            orders = [_swapped(axes, at, p) for p in beside]
        for moved in orders:
            yield _repatterned(line, string, f"{given.rstrip()} -> {' '.join(moved)}")


def _shape_one_off(line: Line) -> Iterator[str]:
    """A mask's shape written out with a size of one for each new axis (``(bs, 1, k_len, 1)``,
    or ``m.view(bs, 1, k_len, 1)``): the last size of one swapped with a size beside it."""
    written: list[list[cst.Element] | list[cst.Arg]] = [
        list(t.elements)
        for t in line.nodes(cst.Tuple)  # type: ignore[attr-defined]
    ]
    written += [positional(c) for c in line.calls("view", "reshape")]
    for sizes in written:
        ones = [i for i, size in enumerate(sizes) if literal(size.value) == 1]
        if not ones or len(sizes) < 3:
            continue
        at = ones[-1]
        for beside in (at - 1, at + 1):
            if 0 <= beside < len(sizes) and beside not in ones:
                yield line.replaced_all({
                    sizes[at].value: sizes[beside].value, sizes[beside].value: sizes[at].value,
                })  # fmt: skip


def _unsqueezed_one_off(line: Line) -> Iterator[str]:
    """A padding mask given its new axes by ``unsqueeze`` (``m.unsqueeze(1).unsqueeze(3)``,
    (B, 1, S, 1)): each literal axis one down, then one up, the last added first, the proof
    choosing."""
    for call in reversed(list(line.calls("unsqueeze"))):
        position = 1 if line.is_function_form(call) else 0
        given = argument(call, position, "dim")
        axis = literal(given.value) if given is not None else None
        if axis is None:
            continue
        for moved in (axis - 1, axis + 1):
            yield line.replaced(call, with_argument(call, position, "dim", str(moved)))


def transpose(line: Line) -> Iterator[str]:
    """Keys transposed on the batch axis: on their last two, (B, T, d) -> (B, d, T)."""
    for call in line.calls("transpose"):
        if not line.is_function_form(call):
            last_two = [cst.Arg(cst.parse_expression(axis)) for axis in ("-2", "-1")]
            yield line.replaced(call, call.with_changes(args=last_two))


MERGE_ORDERS = ("1, 2", "0, 1")


def head_merge_no_transpose(line: Line) -> Iterator[str]:
    """Heads merged by a reshape of (B, h, T, d): the heads moved next to the width first
    (or, folded into the batch, the sequence moved first), the proof choosing."""
    for call in line.calls(*MERGE):
        func = call.func
        if line.is_function_form(call) or not isinstance(func, cst.Attribute):
            continue
        receiver = func.value
        for axes in MERGE_ORDERS:
            if isinstance(receiver, cst.Call) and called(receiver) == "contiguous":
                inner = receiver.func.value  # type: ignore[attr-defined]
                moved = f"{line.code(parenthesized(inner))}.transpose({axes})"
                yield line.replaced(inner, cst.parse_expression(moved))
            else:
                order = f".transpose({axes})" + (".contiguous()" if called(call) == "view" else "")
                moved = f"{line.code(parenthesized(receiver))}{order}"
                yield line.replaced(receiver, cst.parse_expression(moved))
        yield from _unfolded(line, call, receiver)


def _permute_swapped(line: Line) -> Iterator[str]:
    """Each ``x.permute(...)`` on the line with two of its axes swapped, neighbours first."""
    for call in line.calls("permute"):
        order = positional(call)[1:] if line.is_function_form(call) else positional(call)
        if len(order) < 3 or len(order) != len(call.args) - line.is_function_form(call):
            continue
        pairs = sorted(((a, b) for a in range(len(order)) for b in range(a + 1, len(order))),
                       key=lambda p: p[1] - p[0])  # fmt: skip
        for a, b in pairs:
            turned = _swapped(order, a, b)
            args = [t.with_changes(comma=o.comma) for t, o in zip(turned, order, strict=True)]
            head = list(call.args[: len(call.args) - len(order)])
            yield line.replaced(call, call.with_changes(args=head + args))


def _unfolded(line: Line, call: cst.Call, receiver: cst.BaseExpression) -> Iterator[str]:
    """Heads folded into the batch, (B h, T, d), merged by ``x.reshape(B, T, -1)`` straight
    (or ``x.view(B, H, W, -1)`` onto a grid of positions): the heads taken out of the batch
    and put beside the width first, a sequence's heads together (``(b h)``) or each head's
    sequences (``(h b)``), the proof choosing."""
    sizes = positional(call)
    if len(sizes) < 3:
        return
    b = line.code(sizes[0].value)
    if len(sizes) == 3 and isinstance(receiver, cst.Name):
        x, t = receiver.value, line.code(sizes[1].value)
        width = f"{x}.size(-1)"
        for unfold in (
            f"{x}.reshape({b}, -1, {t}, {width}).transpose(1, 2)",
            f"{x}.reshape(-1, {b}, {t}, {width}).permute(1, 2, 0, 3)",
        ):
            yield line.replaced(receiver, cst.parse_expression(unfold))
    x = line.code(parenthesized(receiver))
    then = ".contiguous()" if called(call) == "view" else ""
    for unfold in (
        f"unflatten(0, ({b}, -1)).movedim(1, -2)",
        f"unflatten(0, (-1, {b})).movedim(0, -2)",
    ):
        yield line.replaced(receiver, cst.parse_expression(f"{x}.{unfold}{then}"))


def _moves(count: int) -> list[tuple[int, int]]:
    """(size moved, where to) for a reshape to ``count`` sizes: one size, not the last (the
    width), moved earlier; next-door moves first, then moves to just after the batch."""
    moves = [(moved, to) for moved in range(1, count - 1) for to in range(moved)]
    return sorted(moves, key=lambda m: (m[0] - m[1], m[1] != 1))


def _folded_split(line: Line, call: cst.Call, sizes: list[cst.Arg]) -> Iterator[str]:
    """Heads folded into the batch straight from (B, T, h d), ``reshape(B * h, T, d)``: split
    as (B, T, h, d), the heads moved before the positions, then folded, each factor of the
    product taken as the batch's."""
    product = sizes[0].value
    if len(sizes) != 3 or not (
        isinstance(product, cst.BinaryOperation) and isinstance(product.operator, cst.Multiply)
    ):
        return
    folded, length, width = (line.code(a.value) for a in sizes)
    for batch, heads in ((product.left, product.right), (product.right, product.left)):
        split = f"{line.code(batch)}, {length}, {line.code(heads)}, {width}"
        method = line.code(call.func)  # "tensor.reshape"
        rewritten = f"{method}({split}).transpose(1, 2).{called(call)}({folded}, {length}, {width})"
        yield line.replaced(call, cst.parse_expression(rewritten))


def head_split_view(line: Line) -> Iterator[str]:
    """Heads split by a reshape that cuts the positions up (``(B, T, h d)`` viewed as ``(B, h,
    T, d)``): the reshape made in its input's order, the positions' size moved earlier, and the
    axes put back in the order the code uses by a transpose (or a permute); the proof finds
    which size is the positions'. Heads put where the positions belong by a permute: two of
    its axes swapped, neighbours first."""
    yield from _permute_swapped(line)
    for call in line.calls(*MERGE):
        sizes = positional(call)
        if line.is_function_form(call) or len(sizes) != len(call.args) or len(sizes) < 3:
            continue
        yield from _folded_split(line, call, sizes)
        for moved, to in _moves(len(sizes)):
            order = [i for i in range(len(sizes)) if i != moved]
            order.insert(to, moved)  # order[i]: which of the code's sizes is put i-th
            args = [sizes[i].with_changes(comma=cst.MaybeSentinel.DEFAULT) for i in order]
            back = [order.index(i) for i in range(len(order))]  # the code's axes, from the new
            put = (
                f"transpose({to}, {moved})"
                if moved - to == 1
                else f"permute({', '.join(map(str, back))})"
            )
            made = line.code(call.with_changes(args=args))
            yield line.replaced(call, cst.parse_expression(f"{made}.{put}"))
