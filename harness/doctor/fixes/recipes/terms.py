"""What the recipes share: the calls they look for, and how they read an expression's parts."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from harness.doctor.fixes.line import Line, called

SOFTMAX = ("softmax", "log_softmax")
SDPA = ("scaled_dot_product_attention",)
MADE = ("ones", "zeros", "full", "empty", "rand")  # tensors made from their sizes


def variables_in(line: Line, node: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The variables ``node`` computes with: names, and attributes of ``self`` or of a local
    (``config.initializer_range``), not what they call (``torch``, ``math``), nor keywords or
    attribute names."""
    found: list[cst.BaseExpression] = []

    class Operands(cst.CSTVisitor):
        def visit_Arg(self, arg: cst.Arg) -> bool:
            arg.value.visit(self)
            return False  # not its keyword's name

        def visit_Attribute(self, attribute: cst.Attribute) -> bool:
            root = attribute.value.value if isinstance(attribute.value, cst.Name) else None
            if root == "self" or (root is not None and root not in line.names):
                found.append(attribute)  # self.scale, or a local's: config.initializer_range
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


def literal(node: cst.BaseExpression) -> int | None:
    """An integer written as a literal (``3``, ``-1``), else None."""
    if isinstance(node, cst.Integer):
        return int(node.value)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        inner = literal(node.expression)
        return -inner if inner is not None else None
    return None


LAST_TWO = {"-1", "-2"}  # a transpose of the last two axes: keys for queries


def untransposed(line: Line) -> Iterator[str]:
    """The line with a tensor's transpose of its last two axes (``m.transpose(-1, -2)``)
    taken away: a mask turned from (queries, keys) to (keys, queries), as it was."""
    for call in line.calls("transpose"):
        turns = {line.code(a.value).replace(" ", "") for a in call.args}
        if turns == LAST_TWO and not line.is_function_form(call):
            yield line.replaced(call, call.func.value)  # type: ignore[attr-defined]
