"""The catalogue's fix of each trap that lives in one expression, rewritten into the user's own
line: each recipe yields candidate sources, most likely first; none is shown until one is proven
(``prove``). A recipe reads what the line's code does (which call, which argument), never what
its variables are called, and a candidate the proof rejects costs only time."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from typing import TypeVar

import libcst as cst

from harness.doctor.fixes.line import (
    Line,
    argument,
    called,
    names_in_scope,
    parenthesized,
    positional,
    unread_parameters,
    with_argument,
    without_argument,
)
from harness.doctor.fixes.values import number_of

Item = TypeVar("Item")  # an element of a list two places of which are swapped
Recipe = Callable[[Line], Iterator[str]]

SOFTMAX = ("softmax", "log_softmax")
SOFTMAX_LAYERS = ("Softmax", "LogSoftmax")
TRIANGLES = {"triu": "1", "tril": "0", "triu_": "1", "tril_": "0"}  # each keeps of a causal mask
FILL = ("masked_fill", "masked_fill_")
SDPA = ("scaled_dot_product_attention",)
DROPOUT = ("dropout", "alpha_dropout", "feature_alpha_dropout", "dropout1d", "dropout2d")
PRODUCT = ("matmul", "bmm", "einsum")
ADDED_PRODUCT = ("baddbmm",)  # a term plus a product: input + alpha * (batch1 @ batch2)
ROOT = ("sqrt",)
POWER = ("power", "pow", "float_power")
HALF = ("0.5", "-0.5", "0.25", "-0.25")  # a square root's exponents, as written (and its
# root, where the scale is split between the queries and the keys)
MERGE = ("reshape", "view")
LARGE_FILL = 1e3  # a negative constant this large or larger is a mask's fill, not arithmetic
MADE = ("ones", "zeros", "full", "empty", "rand")  # tensors made from their sizes


def softmax_dim(line: Line) -> Iterator[str]:
    """``softmax(scores)`` without ``dim``, or over another axis: over the last, the keys'
    (``nn.Softmax(dim=1)``, made where the forward's ``self.softmax`` is, too)."""
    for call in line.calls(*SOFTMAX):
        position = 1 if line.is_function_form(call) else 0
        yield line.replaced(call, with_argument(call, position, "dim", "-1"))
    for call in line.calls(*SOFTMAX_LAYERS):
        yield line.replaced(call, with_argument(call, 0, "dim", "-1"))


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
    filled with that value where ``blocked`` is not 0, each side of the product tried as the
    0/1 one."""
    for product in line.nodes(cst.BinaryOperation):
        if not isinstance(product.operator, cst.Multiply):  # type: ignore[attr-defined]
            continue
        sides = (product.left, product.right)  # type: ignore[attr-defined]
        for blocked, value in (sides, sides[::-1]):
            bare = blocked.with_changes(lpar=[], rpar=[])
            mask, test = line.code(bare), line.code(parenthesized(bare))
            made = f"torch.zeros_like({mask}).masked_fill({test} != 0, {line.code(value)})"
            yield line.replaced(product, cst.parse_expression(made))


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
            if called(call) == "size" and not line.is_function_form(call):
                found.append(call)  # a tensor's size: a value in its own right
                return False
            for arg in call.args:
                arg.visit(self)
            return False  # not what it calls

        def visit_Subscript(self, subscript: cst.Subscript) -> bool:
            shape = subscript.value
            if isinstance(shape, cst.Attribute) and shape.attr.value == "shape":
                found.append(subscript)  # x.shape[-1]
                return False
            return True

        def visit_Name(self, name: cst.Name) -> bool:
            if not callable(line.names.get(name.value)) and name.value not in ("True", "False"):
                found.append(name)
            return False

    node.visit(Operands())
    return found


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
        for operand in _operands(line, root):
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
    rooted = {line.code(o) for root in _roots(line) for o in _operands(line, root)}
    operands = [o for o in _operands(line, computed) if line.code(o) not in rooted]
    values = line.values([line.code(o) for o in operands])
    for operand in operands:
        value = number_of(values.get(line.code(operand)))
        if value is not None and value > 1 and value == int(value):
            yield operand


def _literal(node: cst.BaseExpression) -> int | None:
    """An integer written as a literal (``3``, ``-1``), else None."""
    if isinstance(node, cst.Integer):
        return int(node.value)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        inner = _literal(node.expression)
        return -inner if inner is not None else None
    return None


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
        if argument(call, 3, "attn_mask") is None:
            yield line.replaced(call, with_argument(call, 5, "is_causal", "True"))
    yield from _bounds_one_off(line)


# A comparison's operator with its bound moved by one: (i - j < w) is (i - j <= w - 1).
ONE_OFF: dict[type[cst.BaseCompOp], Callable[[], cst.BaseCompOp]] = {
    cst.LessThan: cst.LessThanEqual, cst.LessThanEqual: cst.LessThan,
    cst.GreaterThan: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.GreaterThan,
}  # fmt: skip


def _bounds_one_off(line: Line) -> Iterator[str]:
    """A bound on the distance between query and key written one off: a literal bound one up
    and one down (``dist >= -1``), else the comparison made strict or not (``<`` and ``<=``)."""
    for comparison in line.nodes(cst.Comparison):
        for target in comparison.comparisons:  # type: ignore[attr-defined]
            bound = _literal(target.comparator)
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
        written, value = line.code(given.value), _literal(given.value)
        for step in ("+ 1", "- 1"):
            if value is not None:
                moved = str(value + 1 if step == "+ 1" else value - 1)
            else:
                moved = f"{line.code(given.value)} {step}"  # + and - bind no tighter
            if moved != written:
                yield line.replaced(given.value, cst.parse_expression(moved))
    yield from _bounds_one_off(line)


def dropout_in_eval(line: Line) -> Iterator[str]:
    """A dropout that drops in eval mode, in a method, told to drop only while its module
    trains: a dropout function given ``training=self.training``, SDPA's ``dropout_p`` given
    only then (a plain function has no module to ask)."""
    function, klass = line.enclosing()
    params = function.params.params if function is not None else ()
    if klass is None or not params:
        return  # not a method: no instance whose ``training`` to read
    training = f"{params[0].name.value}.training"
    for call in line.calls(*DROPOUT):
        if line.is_function_form(call):
            yield line.replaced(call, with_argument(call, 2, "training", training))
    for call in line.calls(*SDPA):
        given = argument(call, 4, "dropout_p")
        if given is not None:
            gated = f"{line.code(given.value)} if {training} else 0.0"
            yield line.replaced(given.value, cst.parse_expression(gated))
    if not list(line.calls(*DROPOUT, *SDPA)):  # where a rate read by a dropout is made
        for assign in line.nodes(cst.Assign):
            gated = f"{line.code(assign.value)} if {training} else 0.0"  # type: ignore[attr-defined]
            yield line.replaced(assign.value, cst.parse_expression(gated))  # type: ignore[attr-defined]


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
    for call in line.calls("transpose"):  # the mask turned onto the queries: as it was
        turns = {line.code(a.value).replace(" ", "") for a in call.args}
        if turns == LAST_TWO and not line.is_function_form(call):
            yield line.replaced(call, call.func.value)  # type: ignore[attr-defined]


LAST_TWO = {"-1", "-2"}  # a transpose of the last two axes: keys for queries


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
        ones = [i for i, size in enumerate(sizes) if _literal(size.value) == 1]
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
        axis = _literal(given.value) if given is not None else None
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


# The axes a merge's heads are moved past: (B, h, T, d) -> (B, T, h, d); heads folded into
# the batch, (B * h, T, d), turned to (T, B * h, d) for a sequence-first output.
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


def _unfolded(line: Line, call: cst.Call, receiver: cst.BaseExpression) -> Iterator[str]:
    """Heads folded into the batch, (B h, T, d), merged by ``x.reshape(B, T, -1)`` straight:
    the heads taken out of the batch and put beside the width first, a sequence's heads
    together (``(b h)``) or each head's sequences (``(h b)``), the proof choosing."""
    sizes = positional(call)
    if len(sizes) != 3 or not isinstance(receiver, cst.Name):
        return
    x, b, t = receiver.value, line.code(sizes[0].value), line.code(sizes[1].value)
    width = f"{x}.size(-1)"
    for unfold in (
        f"{x}.reshape({b}, -1, {t}, {width}).transpose(1, 2)",
        f"{x}.reshape(-1, {b}, {t}, {width}).permute(1, 2, 0, 3)",
    ):
        yield line.replaced(receiver, cst.parse_expression(unfold))


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
    which size is the positions'."""
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


INITS = ("normal_", "trunc_normal_")


def drawn_smaller(line: Line) -> Iterator[str]:
    """Projection weights drawn with a spread as large as 1 (``normal_(w, std=1.0)``): the
    spread put as each number, or name worth less than 1, that the function's other inits
    draw with (the module's own ``init_std``, ``0.02``), each value once, then as the
    catalogue's fix draws them (``xavier_uniform_``), the proof choosing. No other name in
    scope: any small spread passes the probes, and only the module's own is its meaning."""
    others = [  # the spreads the function draws its other weights with: a number, or names
        line.code(o) for call in line.in_function(cst.Call) if called(call) in INITS  # type: ignore[arg-type]
        and (spread := _spread(line, call)) is not None
        for o in ([spread.value] if _number(spread.value) else _operands(line, spread.value))
    ]  # fmt: skip
    for call in line.calls(*INITS):
        given = _spread(line, call)
        tensor = call.args[0].value if line.is_function_form(call) and call.args else None
        if given is not None:
            names = [n for n in dict.fromkeys(others) if n != line.code(given.value)]
            values = line.values(names)
            tried: set[float] = set()
            for name in names:
                spread = number_of(values.get(name))
                if spread is None or not 0 < spread < 1 or spread in tried:
                    continue
                tried.add(spread)
                yield line.replaced(given.value, cst.parse_expression(name))
        if tensor is not None and isinstance(call.func, cst.Attribute):
            module = line.code(call.func.value)
            fixed = f"{module}.xavier_uniform_({line.code(tensor)})"
            yield line.replaced(call, cst.parse_expression(fixed))


def repeated_other_way(line: Line) -> Iterator[str]:
    """A rotary table's angles repeated for the other pairing than its rotation's: side by
    side (``cat((f, f), dim=-1)``, halves) turned into each twice in a row
    (``repeat_interleave(f, 2, dim=-1)``, pairs), and the other way round."""
    for call in line.calls("cat", "concat", "concatenate"):
        parts = call.args[0].value if call.args else None
        if not isinstance(parts, cst.Tuple | cst.List) or len(parts.elements) != 2:
            continue
        first, second = (line.code(e.value) for e in parts.elements)
        if first == second and isinstance(call.func, cst.Attribute):
            module = line.code(call.func.value)
            paired = f"{module}.repeat_interleave({first}, 2, dim=-1)"
            yield line.replaced(call, cst.parse_expression(paired))
    for call in line.calls("repeat_interleave"):
        if line.is_function_form(call) and call.args and isinstance(call.func, cst.Attribute):
            table, module = line.code(call.args[0].value), line.code(call.func.value)
        elif isinstance(call.func, cst.Attribute):
            table, module = line.code(call.func.value), "torch"
        else:
            continue
        halves = f"{module}.cat(({table}, {table}), dim=-1)"
        yield line.replaced(call, cst.parse_expression(halves))


def _number(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Float | cst.Integer)


def _spread(line: Line, call: cst.Call) -> cst.Arg | None:
    """An init call's ``std``."""
    return argument(call, 2 if line.is_function_form(call) else 1, "std")


def rope_on_value(line: Line) -> Iterator[str]:
    """Values rotated by position: a call on the line that rotates one tensor, left out (its
    first argument kept); or, where a call rotates a pair and assigns it back
    (``q, v = rotate(q, v, ...)``), one of the pair put as a tensor made beside it
    (``q, k, v = ...`` before it); the proof finds the one that rotates the values."""
    for call in line.nodes(cst.Call):
        given = positional(call)  # type: ignore[arg-type]
        if given:
            yield line.replaced(call, given[0].value)
    for assign in line.nodes(cst.Assign):
        yield from _rotated_instead(line, assign)  # type: ignore[arg-type]
        yield from _one_less(line, assign)  # type: ignore[arg-type]


def _one_less(line: Line, assign: cst.Assign) -> Iterator[str]:
    """``q, k, v = rotate(pos, q, k, v)``: one name left out of both sides (the last first),
    its tensor then not rotated."""
    targets = [t.target for t in assign.targets]
    if len(targets) != 1 or not isinstance(targets[0], cst.Tuple | cst.List):
        return
    call, elements = assign.value, list(targets[0].elements)
    if not isinstance(call, cst.Call) or len(elements) < 3:
        return
    given = positional(call)
    names = [e.value.value for e in elements if isinstance(e.value, cst.Name)]
    for name in reversed(names):
        at = [i for i, a in enumerate(given) if isinstance(a.value, cst.Name)
              and a.value.value == name]  # fmt: skip
        if len(at) != 1:
            continue
        kept = [e for e in elements if line.code(e.value) != name]
        args = [a for a in call.args if a is not given[at[0]]]
        last = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        shorter = assign.with_changes(
            targets=[assign.targets[0].with_changes(target=targets[0].with_changes(
                elements=[*kept[:-1], kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)]
            ))],
            value=call.with_changes(args=[*args[:-1], last]),
        )  # fmt: skip
        yield line.replaced(assign, shorter)


def _rotated_instead(line: Line, assign: cst.Assign) -> Iterator[str]:
    """``a, b = f(a, b, ...)`` with ``b`` put as each name made in one statement with it
    (``a, c, b = ...`` elsewhere in the function) that the line does not already rotate."""
    targets = [t.target for t in assign.targets]
    if len(targets) != 1 or not isinstance(targets[0], cst.Tuple | cst.List):
        return
    if not isinstance(assign.value, cst.Call):
        return
    given = {a.value.value: a for a in positional(assign.value) if isinstance(a.value, cst.Name)}
    pair = {e.value.value: e for e in targets[0].elements if isinstance(e.value, cst.Name)}
    for name in [n for n in pair if n in given][::-1]:  # the second of a pair first
        for other in _made_with(line, name, set(given)):
            renamed = cst.Name(other)
            yield line.replaced_all({
                pair[name].value: renamed, given[name].value: renamed,
            })  # fmt: skip


def _made_with(line: Line, name: str, taken: set[str]) -> list[str]:
    """The names the enclosing function assigns in one statement with ``name``
    (``q, k, v = ...``), in their order there; where it assigns each on its own, the
    ``SIBLINGS`` names it takes or assigns that share most of a prefix or suffix with ``name``
    (``key_states`` beside ``value_states``); none of ``taken`` (rotated here already)."""
    found: dict[str, None] = {}
    function, _ = line.enclosing()
    params = function.params.params if function is not None else ()
    alone = {p.name.value: None for p in params if p.name.value not in taken}
    for assign in line.in_function(cst.Assign):
        for target in (t.target for t in assign.targets):  # type: ignore[attr-defined]
            if isinstance(target, cst.Name) and target.value not in taken:
                alone.setdefault(target.value)
            if not isinstance(target, cst.Tuple | cst.List):
                continue
            names = [e.value.value for e in target.elements if isinstance(e.value, cst.Name)]
            if name in names:
                found.update(dict.fromkeys(n for n in names if n not in taken))
    if found:
        return list(found)
    shared = {other: _affix(name, other) for other in alone}
    ranked = sorted((o for o in alone if shared[o] >= AFFIX), key=lambda o: -shared[o])
    return ranked[:SIBLINGS]


SIBLINGS = 3  # names tried in place of one rotated by mistake, where none is made with it
AFFIX = 2  # characters a sibling's name shares with it at its start or end, at least


def _affix(a: str, b: str) -> int:
    """The length of the longer of the prefix and the suffix ``a`` and ``b`` share."""

    def shared(x: str, y: str) -> int:
        return next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q),
                    min(len(x), len(y)))  # fmt: skip

    return max(shared(a, b), shared(a[::-1], b[::-1]))


RECIPES: dict[str, Recipe] = {
    "softmax_dim": softmax_dim,
    "mask_bool": mask_bool,
    "sdpa_mask_inverted": sdpa_mask_inverted,
    "sdpa_float_mask": sdpa_float_mask,
    "missing_scale": missing_scale,
    "scale_d_model": scale_d_model,
    "double_scale": double_scale,
    "wrong_scale": scale_d_model,
    "scale_after_softmax": scale_after_softmax,
    "causal_leak": causal_leak,
    "sliding_window_off_by_one": window_bound,
    "padding_on_queries": padding_on_queries,
    "mask_rank": mask_rank,
    "gqa_kv_grouping": gqa_kv_grouping,
    "fill_too_small": finite_fill,
    "fill_overflow_half": finite_fill,
    "qk_overflow_half": scale_queries_first,
    "dropout_in_eval": dropout_in_eval,
    "mask_to_additive_nan": additive_nan,
    "transpose": transpose,
    "head_merge_no_transpose": head_merge_no_transpose,
    "head_split_view": head_split_view,
    "rope_on_value": rope_on_value,
    "softcap_after_mask": cap_before_mask,
    "init_unit_variance": drawn_smaller,
    "rope_pairing_mismatch": repeated_other_way,
}
