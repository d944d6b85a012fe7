"""The catalogue's fix of each trap that lives in one expression, rewritten into the user's own
line: each recipe yields candidate sources, most likely first; none is shown until one is proven
(``prove``). A recipe reads what the line's code does (which call, which argument), never what
its variables are called, and a candidate the proof rejects costs only time."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import libcst as cst

from harness.doctor.fixes.line import (
    Line,
    argument,
    called,
    names_in_scope,
    parenthesized,
    with_argument,
    without_argument,
)
from harness.doctor.fixes.values import number_of

Recipe = Callable[[Line], Iterator[str]]

SOFTMAX = ("softmax", "log_softmax")
FILL = ("masked_fill", "masked_fill_")
SDPA = ("scaled_dot_product_attention",)
PRODUCT = ("matmul", "bmm", "einsum")
ROOT = ("sqrt",)
HALF = ("0.5", "-0.5")  # the exponents of a square root, as written
MERGE = ("reshape", "view")


def softmax_dim(line: Line) -> Iterator[str]:
    """``softmax(scores)`` without ``dim``, or over another axis: over the last, the keys'."""
    for call in line.calls(*SOFTMAX):
        position = 1 if line.is_function_form(call) else 0
        yield line.replaced(call, with_argument(call, position, "dim", "-1"))


def _inverted(node: cst.BaseExpression) -> cst.BaseExpression:
    """The condition read the other way: ``mask == 0`` <-> ``mask == 1``, ``~m`` -> ``m``,
    ``a != b`` -> ``a == b``, ``a < b`` -> ``a >= b``; else ``~(node)``."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.BitInvert):
        inner = node.expression
        return inner.with_changes(lpar=[], rpar=[]) if isinstance(inner, cst.Name) else inner
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
    """A mask filled where it keeps: the fill's condition read the other way round."""
    for call in line.calls(*FILL):
        condition = argument(call, 1 if line.is_function_form(call) else 0, "mask")
        if condition is not None:
            yield line.replaced(condition.value, _inverted(condition.value))
    for call in line.calls("where"):
        condition = argument(call, 0, "condition")
        if condition is not None:
            yield line.replaced(condition.value, _inverted(condition.value))


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


def sdpa_float_mask(line: Line) -> Iterator[str]:
    """A 0/1 float mask given to SDPA, which adds a float mask to the scores: given as bool,
    where it is given or where it is made."""
    for mask in _sdpa_masks(line):
        yield line.replaced(mask, cst.parse_expression(f"{line.code(parenthesized(mask))}.bool()"))


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
    told ``scale=1`` left to its default."""
    for call in line.calls(*SDPA):
        without = without_argument(call, "scale")
        if without is not None:
            yield line.replaced(call, without)
    for product, queries in _products(line):
        factor = cst.parse_expression(f"{line.code(parenthesized(queries))}.size(-1) ** -0.5")
        yield line.replaced(product, cst.BinaryOperation(product, cst.Multiply(), factor))


def _roots(line: Line) -> Iterator[cst.BaseExpression]:
    """What the line takes a square root of: ``sqrt(x)``, ``x ** 0.5``, ``x ** -0.5``."""
    for call in line.calls(*ROOT):
        if call.args:
            yield call.args[0].value
    for node in line.nodes(cst.BinaryOperation):
        exponent = line.code(node.right).replace(" ", "").strip("()")  # type: ignore[attr-defined]
        if isinstance(node.operator, cst.Power) and exponent in HALF:  # type: ignore[attr-defined]
            yield node.left  # type: ignore[attr-defined]


def _operands(line: Line, node: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The variables ``node`` computes with: names and ``self.`` attributes, not what they
    call (``torch``, ``math``), nor keywords or attribute names."""
    found: list[cst.BaseExpression] = []

    class Operands(cst.CSTVisitor):
        def visit_Arg(self, arg: cst.Arg) -> bool:
            arg.value.visit(self)
            return False  # not its keyword's name

        def visit_Attribute(self, attribute: cst.Attribute) -> bool:
            if isinstance(attribute.value, cst.Name) and attribute.value.value == "self":
                found.append(attribute)
                return False
            attribute.value.visit(self)
            return False  # not the attribute's name

        def visit_Call(self, call: cst.Call) -> bool:
            for arg in call.args:
                arg.visit(self)
            return False  # not what it calls

        def visit_Name(self, name: cst.Name) -> bool:
            if not callable(line.names.get(name.value)) and name.value not in ("True", "False"):
                found.append(name)
            return False

    node.visit(Operands())
    return found


def scale_d_model(line: Line) -> Iterator[str]:
    """The scale's square root taken of the model's width: each size it is taken of, put as
    another size in scope (a name's, else a tensor's last), each value once (what the line's
    names are worth when it runs; the head width among them, and the proof tells which)."""
    names = list(names_in_scope(line))
    scope = [*names, *(f"{name}.size(-1)" for name in names)]  # a tensor's width too
    for root in _roots(line):
        for operand in _operands(line, root):
            written = line.code(operand)
            values = line.values([written, *scope])
            current = number_of(values.get(written))
            if current is None:
                continue
            sizes = {n: number_of(values.get(n)) for n in scope if n != written}
            tried: set[float] = set()
            for name in sizes:
                size = sizes[name]
                if size is None or size <= 0 or size == current or size in tried:
                    continue
                tried.add(size)
                yield line.replaced(operand, cst.parse_expression(name))


def double_scale(line: Line) -> Iterator[str]:
    """A scale applied twice: one application dropped (a product's factor, or SDPA told the
    same scale the queries already carry: its own default kept instead, or none)."""
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


def transpose(line: Line) -> Iterator[str]:
    """Keys transposed on the batch axis: on their last two, (B, T, d) -> (B, d, T)."""
    for call in line.calls("transpose"):
        if not line.is_function_form(call):
            last_two = [cst.Arg(cst.parse_expression(axis)) for axis in ("-2", "-1")]
            yield line.replaced(call, call.with_changes(args=last_two))


def head_merge_no_transpose(line: Line) -> Iterator[str]:
    """Heads merged by a reshape of (B, h, T, d): the heads moved next to the width first."""
    for call in line.calls(*MERGE):
        func = call.func
        if line.is_function_form(call) or not isinstance(func, cst.Attribute):
            continue
        receiver = func.value
        if isinstance(receiver, cst.Call) and called(receiver) == "contiguous":
            inner = receiver.func.value  # type: ignore[attr-defined]
            moved = cst.parse_expression(f"{line.code(parenthesized(inner))}.transpose(1, 2)")
            yield line.replaced(inner, moved)
        else:
            order = ".transpose(1, 2)" + (".contiguous()" if called(call) == "view" else "")
            moved = cst.parse_expression(f"{line.code(parenthesized(receiver))}{order}")
            yield line.replaced(receiver, moved)


def rope_on_value(line: Line) -> Iterator[str]:
    """Values rotated by position: a call on the line that rotates one tensor, left out (its
    first argument kept); the proof finds the one that rotates the values."""
    for call in line.nodes(cst.Call):
        positional = [a for a in call.args if a.keyword is None and not a.star]  # type: ignore[attr-defined]
        if positional:
            yield line.replaced(call, positional[0].value)


RECIPES: dict[str, Recipe] = {
    "softmax_dim": softmax_dim,
    "mask_bool": mask_bool,
    "sdpa_mask_inverted": sdpa_mask_inverted,
    "sdpa_float_mask": sdpa_float_mask,
    "missing_scale": missing_scale,
    "scale_d_model": scale_d_model,
    "double_scale": double_scale,
    "wrong_scale": scale_d_model,
    "transpose": transpose,
    "head_merge_no_transpose": head_merge_no_transpose,
    "rope_on_value": rope_on_value,
}
