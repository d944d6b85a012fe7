"""One line of a user's source, parsed with LibCST so that an expression on it can be replaced
and the file written back with its formatting and comments as they were."""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

NO_SPACE = cst.AssignEqual(
    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
)


# a node and where it is: its first line and column, its last line, and its place in the
# tree's order (a node before those it holds)
Placed = tuple[int, int, int, int, cst.CSTNode]


@dataclass(frozen=True)
class _Parsed:
    """A source's tree, where each node of it is, and its nodes by their type."""

    wrapper: MetadataWrapper
    positions: Mapping[cst.CSTNode, CodeRange]
    by_type: Mapping[type, list[Placed]]
    # each statement of the module's body, and where its text starts and ends in the source
    # (empty where the statements' texts do not add up to the source)
    tops: tuple[tuple[cst.CSTNode, int, int], ...]

    def top(self, node: cst.CSTNode) -> tuple[cst.CSTNode, int, int] | None:
        """The statement of the module's body that holds ``node``, and its text's span."""
        where = self.positions.get(node)
        for top, start, end in self.tops if where is not None else ():
            span = self.positions[top]
            if span.start.line <= where.start.line and where.end.line <= span.end.line:  # type: ignore[union-attr]
                return top, start, end
        return None

    def placed(self, kind: type | tuple[type, ...]) -> Iterator[Placed]:
        """Every node of ``kind`` (a subclass counts), with where it is."""
        for node_type, placed in self.by_type.items():
            if issubclass(node_type, kind):
                yield from placed


@functools.lru_cache(maxsize=8)
def _parsed(source: str) -> _Parsed:
    """``source`` parsed, and where each node of it is: once per text, for every line of it
    the doctor reads (a tree is never changed in place, so the lines may share it)."""
    wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    by_type: dict[type, list[Placed]] = {}
    for order, (node, where) in enumerate(positions.items()):
        placed = (where.start.line, where.start.column, where.end.line, order, node)
        by_type.setdefault(type(node), []).append(placed)
    return _Parsed(wrapper, positions, by_type, _tops(wrapper.module, source))


def _tops(module: cst.Module, source: str) -> tuple[tuple[cst.CSTNode, int, int], ...]:
    """Each statement of ``module``'s body and the span of its text in ``source``, where the
    texts of the header, the statements and the footer add up to the source."""
    header = "".join(module.code_for_node(line) for line in module.header)
    texts = [module.code_for_node(statement) for statement in module.body]
    footer = "".join(module.code_for_node(line) for line in module.footer)
    if header + "".join(texts) + footer != source:
        return ()
    tops, start = [], len(header)
    for statement, text in zip(module.body, texts, strict=True):
        tops.append((statement, start, start + len(text)))
        start += len(text)
    return tuple(tops)


@dataclass(frozen=True)
class Line:
    """Line ``number`` of ``source``; ``names``: the globals of the code there (what its names
    are bound to when it runs, so ``F.softmax`` is told from ``scores.softmax``)."""

    source: str
    number: int
    names: Mapping[str, object]
    # the values expressions have on the line when the code runs ({} where not known)
    values: Callable[[list[str]], Mapping[str, object]] = lambda expressions: {}
    width: int | None = None  # the model width the module is probed at, where known
    root: float | None = None  # the size a scale's square root should be taken of, where known

    @property
    def _wrapper(self) -> MetadataWrapper:
        return _parsed(self.source).wrapper

    @property
    def _positions(self) -> Mapping[cst.CSTNode, CodeRange]:
        return _parsed(self.source).positions

    @functools.cached_property
    def _statement(self) -> tuple[int, int]:
        """The first and last line of the simple statement the line is part of (a call
        written over several lines is one statement, whichever of its lines ran)."""
        spans = [
            (first, last)
            for first, _, last, _, _ in _parsed(self.source).placed(cst.SimpleStatementLine)
            if first <= self.number <= last
        ]
        return min(spans, key=lambda s: s[1] - s[0], default=(self.number, self.number))

    def ran(self, lines: set[int]) -> bool:
        """Whether the line's statement is among ``lines`` that ran (any line of it)."""
        first, last = self._statement
        return any(n in lines for n in range(first, last + 1))

    def nodes(self, kind: type[cst.CSTNode] | tuple[type[cst.CSTNode], ...]) -> list[cst.CSTNode]:
        """The nodes of ``kind`` on the line's statement or around it, outermost first."""
        first, last = self._statement
        found = [
            placed
            for placed in _parsed(self.source).placed(kind)
            if placed[0] <= last and placed[2] >= first
        ]
        return [node for *_, node in sorted(found, key=lambda f: (f[0], f[1], f[3]))]

    def calls(self, *names: str) -> list[cst.Call]:
        """The calls on the line of a function or method called one of ``names``."""
        return [c for c in self.nodes(cst.Call) if called(c) in names]  # type: ignore[misc]

    def code(self, node: cst.CSTNode) -> str:
        return self._wrapper.module.code_for_node(node)

    def replaced(self, old: cst.CSTNode, new: cst.CSTNode) -> str:
        """The whole source with ``old`` replaced by ``new``: in the statement of the module
        that holds it, whose text alone is written again (a whole module rewritten is slow)."""
        module, top = self._wrapper.module, _parsed(self.source).top(old)
        changed = top[0].deep_replace(old, new) if top is not None else None
        if top is None or not isinstance(changed, cst.CSTNode):
            return module.deep_replace(old, new).code  # type: ignore[union-attr]
        _, start, end = top
        return self.source[:start] + module.code_for_node(changed) + self.source[end:]

    def replaced_all(self, changes: Mapping[cst.CSTNode, cst.CSTNode]) -> str:
        """The whole source with each node of ``changes`` replaced by its value."""

        class Replace(cst.CSTTransformer):
            def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:
                return changes.get(original, updated)  # type: ignore[return-value]

        return self._wrapper.module.visit(Replace()).code

    def in_function(self, kind: type[cst.CSTNode]) -> list[cst.CSTNode]:
        """The nodes of ``kind`` in the function around the line (the line's, where none)."""
        function, _ = self.enclosing()
        if function is None:
            return self.nodes(kind)
        span = self._positions[function]
        found = [
            placed
            for placed in _parsed(self.source).placed(kind)
            if span.start.line <= placed[0] <= span.end.line
        ]
        return [node for *_, node in sorted(found, key=lambda f: f[3])]

    def enclosing(self) -> tuple[cst.FunctionDef | None, cst.ClassDef | None]:
        """The innermost function and class around the line."""
        functions, classes = self.nodes(cst.FunctionDef), self.nodes(cst.ClassDef)
        return (functions[-1] if functions else None, classes[-1] if classes else None)

    def assigned(self, name: cst.BaseExpression) -> list[cst.BaseExpression]:
        """The values the enclosing function assigns to ``name`` where it is a plain local
        (``attn_mask = mask[:, None]``), other than None: where what the line uses is made."""
        function, _ = self.enclosing()
        if function is None or not isinstance(name, cst.Name):
            return []
        return [
            value
            for target, value in _assignments(function)
            if isinstance(target, cst.Name) and target.value == name.value
            and value is not None and not (isinstance(value, cst.Name) and value.value == "None")
        ]  # fmt: skip

    def origins(self) -> list[int]:
        """The lines where what the line reads is made: where the enclosing function assigns
        each plain local name on the line (``scale = n ** -0.5``, before ``q * scale``);
        each ``self.x = ...`` of the enclosing class for an ``self.x`` on the line, and, where
        the value assigned is a parameter of the method that assigns it, each line of the file
        that constructs the class with that argument (a scale made in ``__init__`` from what
        the model passes)."""
        function, klass = self.enclosing()
        found: dict[int, None] = {}
        names = {node.value for node in self.nodes(cst.Name)}
        if function is not None:
            for target, _ in _assignments(function):
                if isinstance(target, cst.Name) and target.value in names:
                    found.setdefault(self._positions[target].start.line)
        read = {node.attr.value for node in self.nodes(cst.Attribute) if _on_self(node)}
        methods = klass.body.children if klass is not None else ()
        for method in methods:
            if not isinstance(method, cst.FunctionDef):
                continue
            for target, value in _assignments(method):
                if not (_on_self(target) and target.attr.value in read):  # type: ignore[attr-defined]
                    continue
                found.setdefault(self._positions[target].start.line)
                for call in self._constructions(klass, method, value):  # type: ignore[arg-type]
                    found.setdefault(self._positions[call].start.line)
        found.pop(self.number, None)
        return list(found)

    def shared_origins(self) -> list[int]:
        """The lines where the enclosing function assigns a plain local name this line reads
        that another line of the function reads too (``dropout_p = ...`` before two calls):
        a value read in two places is fixed where it is made, which covers both. The value
        read is the one last assigned before this line; a name assigned again (``attn =
        attn.view(...)``) holds another from there on, and a read of that is not shared."""
        function, _ = self.enclosing()
        if function is None:
            return []
        names = {node.value for node in self.nodes(cst.Name)}
        assigned: dict[str, list[int]] = {}
        for target, _ in _assignments(function):
            if isinstance(target, cst.Name) and target.value in names:
                assigned.setdefault(target.value, []).append(self._positions[target].start.line)
        readers: dict[str, set[int]] = {}
        for node in _reads(function):
            if node.value in assigned:
                readers.setdefault(node.value, set()).add(self._positions[node].start.line)
        shared = []
        for name, lines in assigned.items():
            before = [n for n in lines if n < self.number]
            if not before:
                continue
            made = max(before)
            again = min((n for n in lines if n > made), default=None)
            reads = {n for n in readers.get(name, ()) if made < n and (again is None or n <= again)}
            if reads - {self.number}:
                shared.append(made)
        return shared

    def _constructions(
        self, klass: cst.ClassDef, method: cst.FunctionDef, value: cst.BaseExpression | None
    ) -> Iterator[cst.BaseExpression]:
        """Where the file constructs ``klass`` with the argument that ``method``'s parameter
        ``value`` (a plain name) receives: the argument given, in each such call."""
        if not isinstance(value, cst.Name):
            return
        params = [p.name.value for p in method.params.params if p.name.value not in ("self", "cls")]
        if value.value not in params:
            return
        position = params.index(value.value)
        for *_, node in sorted(_parsed(self.source).placed(cst.Call), key=lambda f: f[3]):
            if called(node) == klass.name.value:  # type: ignore[arg-type]
                given = argument(node, position, value.value)
                if given is not None:
                    yield given.value

    def operand(self, call: cst.Call) -> cst.BaseExpression | None:
        """The tensor a call works on: its first argument in the function form
        (``F.softmax(x)``, ``self.softmax(x)``), its receiver in the method form
        (``x.softmax()``); None where it has neither."""
        if self.is_function_form(call):
            return call.args[0].value if call.args else None
        return call.func.value if isinstance(call.func, cst.Attribute) else None

    def is_function_form(self, call: cst.Call) -> bool:
        """``F.softmax(x, ...)`` (the callee is an attribute of a module the code imported, or
        of the instance the method runs on: ``self.softmax(x)``) rather than
        ``x.softmax(...)``: the tensor is the first argument, not the receiver."""
        func = call.func
        if isinstance(func, cst.Name):
            return True
        if not isinstance(func, cst.Attribute):
            return False
        function, klass = self.enclosing()
        params = function.params.params if function is not None and klass is not None else ()
        if params and isinstance(func.value, cst.Name) and func.value.value == params[0].name.value:
            return True  # self.softmax(scores): a layer of the instance, given the tensor
        return isinstance(_resolved(func.value, self.names), types.ModuleType)


def _on_self(node: cst.BaseExpression) -> bool:
    """``self.x``: an attribute of the instance itself."""
    return (
        isinstance(node, cst.Attribute)
        and isinstance(node.value, cst.Name)
        and node.value.value == "self"
    )


def called(call: cst.Call) -> str:
    """The name a call calls: ``softmax`` for ``F.softmax(...)`` and ``x.softmax(...)``."""
    func = call.func
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return func.value if isinstance(func, cst.Name) else ""


def _resolved(node: cst.BaseExpression, names: Mapping[str, object]) -> object:
    """What a dotted name (``torch.nn.functional``) is bound to in ``names``; None if unknown."""
    if isinstance(node, cst.Name):
        return names.get(node.value)
    if isinstance(node, cst.Attribute):
        owner = _resolved(node.value, names)
        return getattr(owner, node.attr.value, None) if owner is not None else None
    return None


def positional(call: cst.Call) -> list[cst.Arg]:
    """The arguments a call gives by position (not by keyword, not unpacked)."""
    return [a for a in call.args if a.keyword is None and not a.star]


def argument(call: cst.Call, position: int, keyword: str) -> cst.Arg | None:
    """The argument given at ``position`` (counting positional ones) or as ``keyword``."""
    given = positional(call)
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg
    return given[position] if position < len(given) else None


def with_argument(call: cst.Call, position: int, keyword: str, value: str) -> cst.Call:
    """``call`` with the argument at ``position`` or ``keyword`` set to ``value``: replaced
    where given, else added as ``keyword=value``."""
    expression = cst.parse_expression(value)
    given = argument(call, position, keyword)
    if given is not None:
        return call.deep_replace(given, given.with_changes(value=expression))  # type: ignore
    added = cst.Arg(expression, keyword=cst.Name(keyword), equal=NO_SPACE)
    return call.with_changes(args=[*call.args, added])


def without_argument(call: cst.Call, keyword: str) -> cst.Call | None:
    """``call`` without its ``keyword`` argument; None when it has none."""
    kept = [a for a in call.args if a.keyword is None or a.keyword.value != keyword]
    if len(kept) == len(call.args):
        return None
    if kept:  # the last argument keeps no trailing comma it did not have
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return call.with_changes(args=kept)


def parenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    """``node`` as an operand of a unary operator: in parentheses unless it is atomic."""
    atomic = (cst.Name, cst.Attribute, cst.Call, cst.Subscript)
    if isinstance(node, atomic) or node.lpar:
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def names_in_scope(line: Line) -> Iterator[str]:
    """Expressions that may stand for a size where the line is: the enclosing function's
    parameters (``self`` aside), the names it assigns, and the ``self.`` attributes its class
    assigns anywhere; each once, in that order."""
    function, klass = line.enclosing()
    seen: dict[str, None] = {}
    if function is not None:
        params = function.params
        for param in (*params.posonly_params, *params.params, *params.kwonly_params):
            if param.name.value not in ("self", "cls"):
                seen.setdefault(param.name.value)
        for target in _assigned(function):
            if isinstance(target, cst.Name):
                seen.setdefault(target.value)
    if klass is not None:
        for target in _assigned(klass):
            if _on_self(target):
                seen.setdefault(f"self.{target.attr.value}")  # type: ignore[attr-defined]
    return iter(seen)


def unread_parameters(line: Line) -> set[str]:
    """The enclosing function's parameters its body never reads: what a one-line slip that
    put another name in a parameter's place leaves behind."""
    function, _ = line.enclosing()
    if function is None:
        return set()
    params = function.params
    names = {p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)}
    return names - {name.value for name in _reads(function.body)}


def _assigned(node: cst.CSTNode) -> list[cst.BaseExpression]:
    """The targets ``node``'s statements assign (``a = ...``, ``self.a = ...``, ``a, b = ...``)."""
    return [target for target, _ in _assignments(node)]


def _reads(node: cst.CSTNode) -> list[cst.Name]:
    """The names ``node`` reads: every name but those assigned to and attributes' own."""
    found: list[cst.Name] = []

    class Reads(cst.CSTVisitor):
        def visit_Assign(self, assign: cst.Assign) -> bool:
            assign.value.visit(self)
            return False  # the targets are written, not read

        def visit_Attribute(self, attribute: cst.Attribute) -> bool:
            attribute.value.visit(self)
            return False  # ``x.name``: ``name`` is the attribute's, not a variable

        def visit_Arg(self, arg: cst.Arg) -> bool:
            arg.value.visit(self)
            return False  # ``f(name=...)``: the keyword is no variable

        def visit_Name(self, name: cst.Name) -> None:
            found.append(name)

    node.visit(Reads())
    return found


def _assignments(node: cst.CSTNode) -> list[tuple[cst.BaseExpression, cst.BaseExpression | None]]:
    """Each target ``node``'s statements assign, with the value it gets (None for one of
    several unpacked: ``a, b = ...``)."""
    found: list[tuple[cst.BaseExpression, cst.BaseExpression | None]] = []

    class Assignments(cst.CSTVisitor):
        def visit_Assign(self, assign: cst.Assign) -> None:
            for target in (t.target for t in assign.targets):
                if isinstance(target, cst.Tuple | cst.List):
                    found.extend((element.value, None) for element in target.elements)
                else:
                    found.append((target, assign.value))

    node.visit(Assignments())
    return found
