"""Recipes for the traps of the scores' scale: forgotten, by the wrong size, twice, after the
softmax, or applied to the product instead of the queries."""

from __future__ import annotations

import math
from collections.abc import Iterator

import libcst as cst

from harness.doctor.fixes.line import (
    Line,
    argument,
    called,
    names_in_scope,
    parenthesized,
    unread_parameters,
    with_argument,
    without_argument,
)
from harness.doctor.fixes.recipes.terms import SDPA, SOFTMAX, variables_in
from harness.doctor.fixes.values import number_of

PRODUCT = ("matmul", "bmm", "einsum")
ADDED_PRODUCT = ("baddbmm",)  # a term plus a product: input + alpha * (batch1 @ batch2)
ROOT = ("sqrt",)
POWER = ("power", "pow", "float_power")
HALF = ("0.5", "-0.5", "0.25", "-0.25")  # a square root's exponents, as written (and its
# root, where the scale is split between the queries and the keys)


def _products(line: Line) -> Iterator[tuple[cst.BaseExpression, cst.BaseExpression]]:
    """Each product of queries and keys on the line, with its queries operand."""
    for node in line.nodes((cst.BinaryOperation, cst.Call)):
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
            yield node, node.left
        elif isinstance(node, cst.Call) and called(node) in PRODUCT:
            first = 1 if called(node) == "einsum" else 0
            operands = [a for a in node.args if a.keyword is None]
            if not line.is_function_form(node):
                yield node, node.func.value  # type: ignore[attr-defined]  # q.matmul(k)
            elif len(operands) > first:
                yield node, operands[first].value


def missing_scale(line: Line) -> Iterator[str]:
    """The scores never scaled: scaled by 1/sqrt(d_k), the queries' own last size; an SDPA
    told ``scale=1`` left to its default; against a declared scale, by a name in scope worth
    it (Granite's ``self.scaling``, its attention multiplier)."""
    if line.root is not None:
        names = list(names_in_scope(line))
        values = line.values(names)
        for name in names:
            worth = number_of(values.get(name))
            if worth is not None and math.isclose(worth, line.root**-0.5, rel_tol=1e-6):
                for product, _ in _products(line):
                    scaled = cst.BinaryOperation(
                        product, cst.Multiply(), cst.parse_expression(name)
                    )
                    yield line.replaced(product, scaled)
    for call in line.calls(*SDPA):
        without = without_argument(call, "scale")
        if without is not None:
            yield line.replaced(call, without)
    for product, queries in _products(line):
        factor = cst.parse_expression(f"{line.code(parenthesized(queries))}.size(-1) ** -0.5")
        yield line.replaced(product, cst.BinaryOperation(product, cst.Multiply(), factor))
    for call in line.calls(*ADDED_PRODUCT):  # bias.baddbmm(q, k): its alpha is the scale
        queries = argument(call, 1 if line.is_function_form(call) else 0, "batch1")
        if queries is not None:
            factor = f"{line.code(parenthesized(queries.value))}.size(-1) ** -0.5"
            yield line.replaced(call, with_argument(call, len(call.args), "alpha", factor))


def _roots(line: Line) -> Iterator[cst.BaseExpression]:
    """What the line takes a square root of: ``sqrt(x)``, ``x ** 0.5``, ``x ** -0.5``."""
    for call in line.calls(*ROOT):
        if call.args:
            yield call.args[0].value
    for call in line.calls(*POWER):  # np.power(x, 0.5), torch.pow(x, 0.5), x.pow(0.5)
        exponent = argument(call, 1 if line.is_function_form(call) else 0, "exponent")
        base = line.operand(call)
        if exponent is not None and _exponent(line, exponent.value) in HALF and base is not None:
            yield base
    for node in line.nodes(cst.BinaryOperation):
        exponent = _exponent(line, node.right)  # type: ignore[attr-defined]
        if isinstance(node.operator, cst.Power) and exponent in HALF:  # type: ignore[attr-defined]
            yield node.left  # type: ignore[attr-defined]


def _exponent(line: Line, node: cst.BaseExpression) -> str:
    """An exponent as written, without spaces or parentheses."""
    return line.code(node).replace(" ", "").strip("()")


def scale_d_model(line: Line) -> Iterator[str]:
    """The scale's square root taken of the model's width: each size it is taken of, put as
    another size in scope (a name's, else a tensor's last), then as itself over a count in
    scope that divides it (the width over the heads, where no name holds the head width).
    Each value once (what the line's names are worth when it runs; the proof tells which),
    only the size the root belongs to where the forward shows it (the head width; for a
    declared scale s, 1 / s ** 2), and a name worth the model's width last (a root of the
    width is the trap, whatever the name) unless it is a parameter nothing reads (the name a
    slip put another in place of)."""
    unread = unread_parameters(line)
    names = list(names_in_scope(line))
    scope = [*names, *(f"{name}.size(-1)" for name in names)]  # a tensor's width too
    counts = sorted(names, key=lambda name: not name.startswith("self."))  # the module's first
    for root in _roots(line):
        for operand in variables_in(line, root):
            written = line.code(operand)
            values = line.values([written, *scope])
            current = number_of(values.get(written))
            if current is None:
                continue
            sizes = {n: number_of(values.get(n)) for n in scope if n != written}
            last = {n for n, size in sizes.items() if n not in unread and size == line.width}
            sizes = dict(sorted(sizes.items(), key=lambda item: item[0] in last))
            tried: set[float] = set()
            for name in sizes:
                size = sizes[name]
                if size is None or size <= 0 or size == current or size in tried:
                    continue
                if line.root is not None and not math.isclose(size, line.root):
                    continue  # not the size the forward shows the root belongs to
                tried.add(size)
                yield line.replaced(operand, cst.parse_expression(name))
            for name in counts:
                count = sizes.get(name)
                if count is None or not 1 < count < current or current % count:
                    continue
                if current / count in tried:
                    continue
                if line.root is not None and not math.isclose(current / count, line.root):
                    continue
                tried.add(current / count)
                over = f"({line.code(parenthesized(operand))} // {name})"
                yield line.replaced(operand, cst.parse_expression(over))


def double_scale(line: Line) -> Iterator[str]:
    """A scale applied twice: one application dropped (a product's factor, or SDPA told the
    same scale the queries already carry: its own default kept instead, or none); or a width
    put where its square root is meant (``s / d_k``, which is the scale squared)."""
    for node in line.nodes(cst.BinaryOperation):
        if isinstance(node.operator, cst.Multiply | cst.Divide):  # type: ignore[attr-defined]
            yield line.replaced(node, node.left)  # type: ignore[attr-defined]
    for call in line.calls(*SDPA):
        if argument(call, 6, "scale") is None:
            yield line.replaced(call, with_argument(call, 6, "scale", "1.0"))
        else:
            without = without_argument(call, "scale")
            if without is not None:
                yield line.replaced(call, without)
    for size in _unrooted_sizes(line):
        yield line.replaced(size, cst.parse_expression(f"{line.code(size)} ** 0.5"))


def _unrooted_sizes(line: Line) -> Iterator[cst.BaseExpression]:
    """The sizes the line's statement computes with (names, ``self.`` attributes and tensor
    sizes worth a whole number above 1 when it runs) that no square root is taken of."""
    statements = line.nodes(cst.SimpleStatementLine)
    if not statements:
        return
    computed = getattr(statements[-1].body[0], "value", None)  # type: ignore[attr-defined]
    if not isinstance(computed, cst.BaseExpression):
        return
    rooted = {line.code(o) for root in _roots(line) for o in variables_in(line, root)}
    operands = [o for o in variables_in(line, computed) if line.code(o) not in rooted]
    values = line.values([line.code(o) for o in operands])
    for operand in operands:
        value = number_of(values.get(line.code(operand)))
        if value is not None and value > 1 and value == int(value):
            yield operand


def scale_queries_first(line: Line) -> Iterator[str]:
    """Scores scaled after the product q k^T: the scale moved onto the queries, so that the
    product is made of scaled queries (``(q @ k^T) / s`` -> ``(q / s) @ k^T``)."""
    for node in line.nodes(cst.BinaryOperation):
        if not isinstance(node.operator, cst.Multiply | cst.Divide):  # type: ignore[attr-defined]
            continue
        for product, queries in _products(line):
            if node.left is not product:  # type: ignore[attr-defined]
                continue
            scaled: cst.BaseExpression = cst.BinaryOperation(
                parenthesized(queries),
                node.operator,
                node.right,  # type: ignore[attr-defined]
            )
            if isinstance(product, cst.BinaryOperation):  # an operand of @: in parentheses
                scaled = parenthesized(scaled)
            moved = product.deep_replace(queries, scaled).with_changes(lpar=[], rpar=[])
            yield line.replaced(node, moved)


def scale_after_softmax(line: Line) -> Iterator[str]:
    """Weights scaled after the softmax (``softmax(s) / c``): the factor moved onto the
    scores, inside it (``softmax(s / c)``), where the rows sum to 1 again."""
    for node in line.nodes(cst.BinaryOperation):
        weights = node.left  # type: ignore[attr-defined]
        softmax = _softmax_of(weights)
        if not isinstance(node.operator, cst.Multiply | cst.Divide) or softmax is None:  # type: ignore[attr-defined]
            continue
        scores = line.operand(softmax)
        if scores is None:
            continue
        scaled = cst.BinaryOperation(parenthesized(scores), node.operator, node.right)  # type: ignore[attr-defined]
        inside = scaled if line.is_function_form(softmax) else parenthesized(scaled)
        moved = weights.deep_replace(softmax, softmax.deep_replace(scores, inside))
        yield line.replaced(node, moved.with_changes(lpar=[], rpar=[]))


def _softmax_of(node: cst.BaseExpression) -> cst.Call | None:
    """The softmax call a chain of method calls starts from (``softmax(s).to(v.dtype)``)."""
    while isinstance(node, cst.Call):
        if called(node) in SOFTMAX:
            return node
        if not isinstance(node.func, cst.Attribute):
            return None
        node = node.func.value
    return None


def _exp_of(line: Line, node: cst.BaseExpression) -> str | None:
    """The code ``node`` takes exp of (``s.exp()``, ``torch.exp(s)``), else None."""
    if not isinstance(node, cst.Call) or called(node) != "exp":
        return None
    if line.is_function_form(node):
        return line.code(node.args[0].value) if node.args else None
    return line.code(node.func.value)  # type: ignore[attr-defined]


def softmax_written_out(line: Line) -> Iterator[str]:
    """A softmax written out, ``s.exp() / s.exp().sum(dim=d, keepdim=True)``, which overflows
    at large scores: ``s.softmax(dim=d)``, which subtracts each row's maximum first."""
    for node in line.nodes(cst.BinaryOperation):
        if not isinstance(node.operator, cst.Divide):  # type: ignore[attr-defined]
            continue
        top, bottom = node.left, node.right  # type: ignore[attr-defined]
        bottom = bottom.with_changes(lpar=[], rpar=[])
        if not isinstance(bottom, cst.Call) or called(bottom) != "sum":
            continue
        scores = _exp_of(line, top)
        if scores is None or scores != _exp_of(line, bottom.func.value):  # type: ignore[attr-defined]
            continue
        dim = argument(bottom, 0, "dim")
        axis = line.code(dim.value) if dim is not None else "-1"
        yield line.replaced(node, cst.parse_expression(f"{scores}.softmax(dim={axis})"))
