"""Recipes for rotary's traps: rotating the values, and the tables paired the other way."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from harness.doctor.fixes.line import Line, argument, parenthesized, positional


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
    yield from _flag_turned(line)


def _flag_turned(line: Line) -> Iterator[str]:
    """A rotation called with a flag that picks its pairing (``interleaved=True``): each such
    ``True`` or ``False`` given by keyword, the other way."""
    for call in line.nodes(cst.Call):
        for arg in call.args:  # type: ignore[attr-defined]
            flag = arg.value
            if arg.keyword is None or not isinstance(flag, cst.Name):
                continue
            if flag.value in ("True", "False"):
                other = cst.Name("False" if flag.value == "True" else "True")
                args = [a.with_changes(value=other) if a is arg else a for a in call.args]  # type: ignore[attr-defined]
                yield line.replaced(call, call.with_changes(args=args))


def rope_on_value(line: Line) -> Iterator[str]:
    """Values rotated by position: a call on the line that rotates one tensor, left out (its
    first argument kept); or, where a call rotates a pair and assigns it back
    (``q, v = rotate(q, v, ...)``), one of the pair put as a tensor made beside it
    (``q, k, v = ...`` before it); or, where one rotation is assigned to several names
    (``qk = v = rotate(x)``), a name left out; the proof finds the one that rotates the
    values."""
    for assign in line.nodes(cst.Assign):
        yield from _chain_less(line, assign)  # type: ignore[arg-type]
    for call in line.nodes(cst.Call):
        given = positional(call)  # type: ignore[arg-type]
        if given:
            yield line.replaced(call, given[0].value)
    for assign in line.nodes(cst.Assign):
        yield from _rotated_instead(line, assign)  # type: ignore[arg-type]
        yield from _one_less(line, assign)  # type: ignore[arg-type]


def _chain_less(line: Line, assign: cst.Assign) -> Iterator[str]:
    """``a = b = rotate(x)``: one of the names left out (the last first), which then keeps
    what it held before."""
    if len(assign.targets) < 2:
        return
    for target in reversed(assign.targets):
        kept = [t for t in assign.targets if t is not target]
        yield line.replaced(assign, assign.with_changes(targets=kept))


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


HALVED = ("bfloat16", "float16", "half")  # a cast to a half-precision dtype, by method or dtype


def angles_in_float32(line: Line) -> Iterator[str]:
    """Rotary's angles made in half precision: every cast on the line to bfloat16 or float16
    (``x.to(torch.bfloat16)``, ``x.half()``) made a cast to float32 instead, at once."""
    changes = {}
    for call in line.nodes(cst.Call):
        func = call.func  # type: ignore[attr-defined]
        if not isinstance(func, cst.Attribute):
            continue
        method = func.attr.value
        dtype = argument(call, 0, "dtype") if method == "to" else None  # type: ignore[arg-type]
        to_half = dtype is not None and line.code(dtype.value).split(".")[-1] in HALVED
        if method in ("bfloat16", "half") or to_half:
            changes[call] = cst.parse_expression(f"{line.code(func.value)}.float()")
    if changes:
        yield line.replaced_all(changes)


def last_rows(line: Line) -> Iterator[str]:
    """A cached call given the first rows of a table of every position so far
    (``freqs[:, :n]``, x-transformers' slip): each slice of the line from the start to ``n``
    taken from ``-n`` to the end instead, the rows of the positions it was fed."""
    for element in line.nodes(cst.SubscriptElement):
        cut = element.slice  # type: ignore[attr-defined]
        if not isinstance(cut, cst.Slice) or cut.lower is not None or cut.step is not None:
            continue
        if cut.upper is None:
            continue
        rows = cst.UnaryOperation(cst.Minus(), parenthesized(cut.upper))
        yield line.replaced(cut, cut.with_changes(lower=rows, upper=None, first_colon=cst.Colon()))
