"""Recipes for the traps of a mask's values: which cells it keeps, its fill, and where it meets
the scores (before or after a cap)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import libcst as cst

from harness.doctor.fixes.line import (
    Line,
    argument,
    called,
    parenthesized,
    positional,
    with_argument,
)
from harness.doctor.fixes.recipes.terms import SDPA, literal, untransposed

TRIANGLES = {"triu": "1", "tril": "0", "triu_": "1", "tril_": "0"}  # each keeps of a causal mask
FILL = ("masked_fill", "masked_fill_")
LARGE_FILL = 1e3  # a negative constant this large or larger is a mask's fill, not arithmetic


def _inverted(node: cst.BaseExpression) -> cst.BaseExpression:
    """The condition read the other way: ``mask == 0`` <-> ``mask == 1`` (``mask.eq(0)`` <->
    ``mask.eq(1)``), ``~m`` -> ``m``, ``a != b`` -> ``a == b``, ``a < b`` -> ``a >= b``; else
    ``~(node)``."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
        inner = node.expression
        return inner.with_changes(lpar=[], rpar=[]) if isinstance(inner, cst.Name) else inner
    if isinstance(node, cst.Call) and called(node) in ("eq", "ne") and len(node.args) == 1:
        value = node.args[0].value
        if isinstance(value, cst.Integer) and value.value in ("0", "1"):  # mask.eq(0) <-> eq(1)
            other = cst.Integer("1" if value.value == "0" else "0")
            return node.with_changes(args=[node.args[0].with_changes(value=other)])
    if isinstance(node, cst.Comparison) and len(node.comparisons) == 1:
        target = node.comparisons[0]
        value = target.comparator
        flipped = {cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal, cst.LessThan:
                   cst.GreaterThanEqual, cst.GreaterThanEqual: cst.LessThan, cst.GreaterThan:
                   cst.LessThanEqual, cst.LessThanEqual: cst.GreaterThan}  # fmt: skip
        kind = type(target.operator)
        if kind is cst.Equal and isinstance(value, cst.Integer) and value.value in ("0", "1"):
            other = cst.Integer("1" if value.value == "0" else "0")
            return node.with_changes(comparisons=[target.with_changes(comparator=other)])
        if kind in flipped:
            operator = flipped[kind](
                whitespace_before=target.operator.whitespace_before,  # type: ignore[attr-defined]
                whitespace_after=target.operator.whitespace_after,  # type: ignore[attr-defined]
            )
            return node.with_changes(comparisons=[target.with_changes(operator=operator)])
    return cst.UnaryOperation(cst.BitInvert(), parenthesized(node))


def mask_bool(line: Line) -> Iterator[str]:
    """A mask filled where it keeps: the fill's condition read the other way round, at the
    fill, else where the function makes the mask it fills with (a mask also read elsewhere,
    as a fill of the weights after the softmax)."""
    conditions = [
        a.value
        for c in line.calls(*FILL)
        if (a := argument(c, 1 if line.is_function_form(c) else 0, "mask")) is not None
    ]
    conditions += [a.value for c in line.calls("where") if (a := argument(c, 0, "condition"))]
    for condition in conditions:
        yield line.replaced(condition, _inverted(condition))
    for condition in conditions:  # a mask read in several places: where its name is made
        for made in line.assigned(condition):
            yield line.replaced(made, _inverted(made))
    if not conditions:  # a line that makes the mask: a test on it read the other way
        tests = [n for n in line.nodes(cst.Comparison) if len(n.comparisons) == 1]  # type: ignore[attr-defined]
        tests += [c for c in line.calls("eq", "ne") if not line.is_function_form(c)]
        for test in tests:
            yield line.replaced(test, _inverted(test))  # type: ignore[arg-type]
        for operation in line.nodes(cst.BinaryOperation):
            operator, sides = operation.operator, (operation.left, operation.right)  # type: ignore[attr-defined]
            if isinstance(operator, cst.Multiply):  # an additive mask: m * -big
                for side in sides:
                    yield line.replaced(side, _complement(line, side))
            if isinstance(operator, (cst.BitOr, cst.BitAnd)):  # masks joined: one read wrong
                for side in sides:
                    yield line.replaced(side, _inverted(side))


def additive_nan(line: Line) -> Iterator[str]:
    """An additive mask made as ``blocked * -inf`` (NaN where ``blocked`` is 0): made as zeros
    filled with that value where ``blocked`` is not 0 (zeros like it, or for a bool mask, it
    made a float), each side of the product tried as the 0/1 one."""
    for product in line.nodes(cst.BinaryOperation):
        if not isinstance(product.operator, cst.Multiply):  # type: ignore[attr-defined]
            continue
        sides = (product.left, product.right)  # type: ignore[attr-defined]
        for blocked, value in (sides, sides[::-1]):
            bare = blocked.with_changes(lpar=[], rpar=[])
            mask, test = line.code(bare), line.code(parenthesized(bare))
            made = f"torch.zeros_like({mask}).masked_fill({test} != 0, {line.code(value)})"
            yield line.replaced(product, cst.parse_expression(made))
            floats = f"{test}.float().masked_fill({test} != 0, {line.code(value)})"  # a bool one
            yield line.replaced(product, cst.parse_expression(floats))


def _complement(line: Line, node: cst.BaseExpression) -> cst.BaseExpression:
    """``1 - m`` for a 0/1 mask ``m``, and ``m`` for ``1 - m``."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Subtract):
        one = node.left
        if isinstance(one, cst.Integer | cst.Float) and float(one.value) == 1:
            return node.right
    return cst.parse_expression(f"(1.0 - {line.code(parenthesized(node))})")


def _sdpa_masks(line: Line) -> Iterator[cst.BaseExpression]:
    """The masks the line's SDPA calls are given, then, for a mask given by a local name, the
    values the function assigns to that name (where a mask that may be None is built)."""
    given = [a.value for c in line.calls(*SDPA) if (a := argument(c, 3, "attn_mask")) is not None]
    yield from given
    for mask in given:
        yield from line.assigned(mask)


def sdpa_mask_inverted(line: Line) -> Iterator[str]:
    """A bool mask given to SDPA True where it blocks: read the other way round (SDPA's True
    attends), where it is given or where it is made."""
    for mask in _sdpa_masks(line):
        yield line.replaced(mask, _inverted(mask))


CASTS = ("to", "float", "half", "double", "bfloat16", "type", "type_as")  # methods that cast


def _as_bool(line: Line, node: cst.BaseExpression) -> cst.BaseExpression:
    return cst.parse_expression(f"{line.code(parenthesized(node))}.bool()")


def sdpa_float_mask(line: Line) -> Iterator[str]:
    """A 0/1 float mask given to SDPA, which adds a float mask to the scores: given as bool,
    where it is given or where it is made; on a line that casts the mask to floats on its way
    there (``mask = mask.to(q.dtype)``), the cast made ``.bool()``."""
    for mask in _sdpa_masks(line):
        yield line.replaced(mask, _as_bool(line, mask))
    for cast in line.calls(*CASTS):
        if isinstance(cast.func, cst.Attribute):
            yield line.replaced(cast, _as_bool(line, cast.func.value))


def causal_leak(line: Line) -> Iterator[str]:
    """A causal mask a diagonal off: ``triu`` of the future from the first key after the
    query (``diagonal=1``), ``tril`` of the past up to the query itself (``diagonal=0``); an
    SDPA call with no mask told ``is_causal=True``; a bound on the distance between query and
    key written one off (``dist >= -1``), one up and one down, the proof choosing."""
    for call in line.calls(*TRIANGLES):
        position = 1 if line.is_function_form(call) else 0
        diagonal = TRIANGLES[called(call)]
        given = argument(call, position, "diagonal")
        if given is None or line.code(given.value).strip() != diagonal:
            yield line.replaced(call, with_argument(call, position, "diagonal", diagonal))
    for call in line.calls(*SDPA):
        mask = argument(call, 3, "attn_mask")
        if mask is None or line.code(mask.value).strip() == "None":  # given no mask
            yield line.replaced(call, with_argument(call, 5, "is_causal", "True"))
    yield from _bounds_one_off(line)
    yield from untransposed(line)  # the mask it is given turned to (keys, queries)


ONE_OFF: dict[type[cst.BaseCompOp], Callable[[], cst.BaseCompOp]] = {
    cst.LessThan: cst.LessThanEqual, cst.LessThanEqual: cst.LessThan,
    cst.GreaterThan: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.GreaterThan,
}  # fmt: skip


def _bounds_one_off(line: Line) -> Iterator[str]:
    """A bound on the distance between query and key written one off: a literal bound one up
    and one down (``dist >= -1``), else the comparison made strict or not (``<`` and ``<=``)."""
    for comparison in line.nodes(cst.Comparison):
        for target in comparison.comparisons:  # type: ignore[attr-defined]
            bound = literal(target.comparator)
            for moved in (bound + 1, bound - 1) if bound is not None else ():
                yield line.replaced(target.comparator, cst.parse_expression(str(moved)))
            swapped = ONE_OFF.get(type(target.operator))
            if bound is None and swapped is not None:
                operator = target.operator
                yield line.replaced(operator, swapped().with_changes(
                    whitespace_before=operator.whitespace_before,
                    whitespace_after=operator.whitespace_after,
                ))  # fmt: skip


def window_bound(line: Line) -> Iterator[str]:
    """A sliding window one key off: a band's diagonal (``triu(-w)``) one up and one down,
    or its bound on the distance one off (``<`` and ``<=``), the proof choosing."""
    for call in line.calls(*TRIANGLES):
        given = argument(call, 1 if line.is_function_form(call) else 0, "diagonal")
        if given is None:
            continue
        written, value = line.code(given.value), literal(given.value)
        for step in ("+ 1", "- 1"):
            if value is not None:
                moved = str(value + 1 if step == "+ 1" else value - 1)
            else:
                moved = f"{line.code(given.value)} {step}"  # + and - bind no tighter
            if moved != written:
                yield line.replaced(given.value, cst.parse_expression(moved))
    yield from _bounds_one_off(line)


def bottom_right(line: Line) -> Iterator[str]:
    """A causal triangle anchored top-left, where a cached call has fewer queries than keys:
    the rows cut from a buffer made the last ones (``bias[..., :T, :S]`` to
    ``bias[..., S - T : S, :S]``), or a triangle of a (T, S) tensor moved by ``S - T``
    (``tril(S - T)``, ``triu(S - T + 1)``); SDPA told ``is_causal`` only where queries and
    keys are as many; the proof choosing."""
    for subscript in line.nodes(cst.Subscript):
        elements = subscript.slice  # type: ignore[attr-defined]
        if len(elements) < 2:
            continue
        rows, keys = elements[-2].slice, elements[-1].slice
        if not (isinstance(rows, cst.Slice) and isinstance(keys, cst.Slice)):
            continue
        if rows.lower is not None or rows.upper is None or keys.upper is None or rows.step:
            continue
        T, S = line.code(rows.upper), line.code(keys.upper)
        moved = cst.parse_expression(f"x[{S} - {T} : {S}]").slice[0].slice  # type: ignore
        yield line.replaced(rows, moved)
    for call in line.calls(*TRIANGLES):
        tensor = line.operand(call)
        if not isinstance(tensor, cst.Name):
            continue
        position = 1 if line.is_function_form(call) else 0
        diagonal = argument(call, position, "diagonal")
        now = line.code(diagonal.value) if diagonal is not None else TRIANGLES[called(call)]
        if now != TRIANGLES[called(call)]:
            continue  # a band or a triangle a diagonal off: not this trap's
        offset = f"{tensor.value}.size(-1) - {tensor.value}.size(-2)"
        moved = offset if now == "0" else f"{offset} + {now}"
        yield line.replaced(call, with_argument(call, position, "diagonal", moved))
    for call in line.calls(*SDPA):  # is_causal only where queries and keys are as many
        given, q, k = (argument(call, i, word) for i, word in ((5, "is_causal"), (0, "query"),
                                                                (1, "key")))  # fmt: skip
        if given is None or q is None or k is None or line.code(given.value) == "False":
            continue
        if not all(isinstance(a.value, cst.Name | cst.Attribute) for a in (q, k)):
            continue
        as_many = f"{line.code(q.value)}.size(-2) == {line.code(k.value)}.size(-2)"
        now = line.code(given.value)
        moved = (
            as_many if now == "True" else f"{line.code(parenthesized(given.value))} and {as_many}"
        )
        yield line.replaced(call, with_argument(call, 5, "is_causal", moved))


def finite_fill(line: Line) -> Iterator[str]:
    """A mask filled with a finite constant that logits outgrow or the dtype cannot hold:
    filled with the dtype's own lowest value (``torch.finfo(scores.dtype).min``), else -inf;
    where the line fills with a name, the constant is put as -inf where the name is made."""
    fills = [
        (argument(c, 2 if line.is_function_form(c) else 1, "value"), line.operand(c))
        for c in line.calls(*FILL)
    ]
    fills += [(argument(c, 2, "other"), argument(c, 1, "input")) for c in line.calls("where")
              if line.is_function_form(c)]  # fmt: skip
    for value, scores in fills:
        if value is None or scores is None:
            continue
        scores = scores.value if isinstance(scores, cst.Arg) else scores
        lowest = f"torch.finfo({line.code(parenthesized(scores))}.dtype).min"
        for fill in (lowest, 'float("-inf")')[0 if "torch" in line.names else 1 :]:
            yield line.replaced(value.value, cst.parse_expression(fill))
    if not fills:  # a line that makes the fill: a large negative constant on it
        for node in line.nodes(cst.UnaryOperation):
            number = node.expression  # type: ignore[attr-defined]
            negative = isinstance(node.operator, cst.Minus)  # type: ignore[attr-defined]
            literal = isinstance(number, cst.Float | cst.Integer)
            if negative and literal and float(number.value) >= LARGE_FILL:
                yield line.replaced(node, cst.parse_expression('float("-inf")'))


def cap_before_mask(line: Line) -> Iterator[str]:
    """Scores capped with their mask in them (``c * tanh((s + m) / c)``): the mask added after
    the cap instead (``c * tanh(s / c) + m``), each term of the sum tried as the mask."""
    for assign in line.nodes(cst.Assign):
        value = assign.value  # type: ignore[attr-defined]
        for call in line.calls("tanh"):
            sums = [
                n
                for n in line.nodes(cst.BinaryOperation)
                if isinstance(n.operator, cst.Add) and _inside(n, call)
            ]  # type: ignore[attr-defined]
            for total in sums:
                for kept, mask in ((total.left, total.right), (total.right, total.left)):
                    bare = isinstance(kept, cst.Name | cst.Attribute)
                    inner = kept if bare else kept.with_changes(lpar=total.lpar, rpar=total.rpar)
                    capped = value.deep_replace(total, inner)
                    yield line.replaced(value, cst.BinaryOperation(
                        capped, cst.Add(cst.SimpleWhitespace(" "), cst.SimpleWhitespace(" ")),
                        mask.with_changes(lpar=[], rpar=[]) if bare else mask,
                    ))  # fmt: skip
    yield from _chosen_before_cap(line)


def _chosen_before_cap(line: Line) -> Iterator[str]:
    """``c * tanh(where(m, s, -big) / c)``: the choice made after the cap instead,
    ``where(m, c * tanh(s / c), -big)``."""
    for assign in line.nodes(cst.Assign):
        value = assign.value  # type: ignore[attr-defined]
        for tanh in line.calls("tanh"):
            for where in (c for c in line.calls("where") if _inside(c, tanh)):
                args = positional(where)
                if len(args) != 3:
                    continue
                for kept in (1, 2):
                    capped = value.deep_replace(where, args[kept].value)
                    chosen = [line.code(a.value) for a in args]
                    chosen[kept] = line.code(capped)
                    written = f"{line.code(where.func)}({', '.join(chosen)})"
                    yield line.replaced(value, cst.parse_expression(written))


def _inside(node: cst.CSTNode, outer: cst.CSTNode) -> bool:
    """Whether ``node`` is a part of ``outer``."""
    found = False

    class Find(cst.CSTVisitor):
        def on_visit(self, visited: cst.CSTNode) -> bool:
            nonlocal found
            found = found or (visited is node and visited is not outer)
            return not found

    outer.visit(Find())
    return found
