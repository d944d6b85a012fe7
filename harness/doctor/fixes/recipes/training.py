"""Recipes for the traps of training mode and weights: dropout left on in eval, and projections
drawn with unit spread."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from harness.doctor.fixes.line import Line, argument, called, with_argument
from harness.doctor.fixes.recipes.terms import SDPA, variables_in
from harness.doctor.fixes.values import number_of

DROPOUT = ("dropout", "alpha_dropout", "feature_alpha_dropout", "dropout1d", "dropout2d")


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


INITS = ("normal_", "trunc_normal_")


def drawn_smaller(line: Line) -> Iterator[str]:
    """Projection weights drawn with a spread as large as 1 (``normal_(w, std=1.0)``): the
    spread put as each number, or name worth less than 1, that the function's other inits
    draw with (the module's own ``init_std``, ``0.02``, or a number they scale:
    ``0.02 / sqrt(2 n)``, not an exponent: T5's ``d ** -0.5`` is no 0.5 spread), each value
    once, then as the catalogue's fix draws them
    (``xavier_uniform_``), the proof choosing. No other name in scope: any small spread passes
    the probes, and only the module's own is its meaning. A spread the function is handed
    (``std=std`` in a helper) is its caller's to change: nothing is rewritten there."""
    spreads = [  # the spreads the function draws its other weights with, each as written
        spread.value for call in line.in_function(cst.Call) if called(call) in INITS  # type: ignore[arg-type]
        and (spread := _spread(line, call)) is not None
    ]  # fmt: skip
    others = [line.code(s) for s in spreads if _number(s)] + [
        line.code(o) for s in spreads if not _number(s)
        for o in (*_numbers_in(s), *variables_in(line, s))
    ]  # fmt: skip
    function, _ = line.enclosing()
    handed = {p.name.value for p in function.params.params} if function is not None else set()
    for call in line.calls(*INITS):
        given = _spread(line, call)
        if given is not None and isinstance(given.value, cst.Name) and given.value.value in handed:
            continue
        tensor = call.args[0].value if line.is_function_form(call) and call.args else None
        if given is not None:
            own = line.code(given.value)
            names = [n for n in dict.fromkeys(others) if n != own]
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


def _number(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Float | cst.Integer)


def _numbers_in(node: cst.BaseExpression) -> list[cst.Float]:
    """The decimal numbers written inside ``node`` (``0.02`` in ``0.02 / math.sqrt(2 * n)``),
    not an exponent (``d ** -0.5`` raises to a power; 0.5 is no spread)."""
    found: list[cst.Float] = []

    class Numbers(cst.CSTVisitor):
        def visit_BinaryOperation(self, operation: cst.BinaryOperation) -> bool:
            if isinstance(operation.operator, cst.Power):
                operation.left.visit(self)
                return False
            return True

        def visit_Float(self, number: cst.Float) -> None:
            found.append(number)

    node.visit(Numbers())
    return found


def _spread(line: Line, call: cst.Call) -> cst.Arg | None:
    """An init call's ``std``."""
    return argument(call, 2 if line.is_function_form(call) else 1, "std")
