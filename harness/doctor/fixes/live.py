"""The running code a source line belongs to, and that code swapped for its rewritten source
while a proof runs: the function (a class's method or a module's function) loaded from the file
whose lines hold it, compiled again from the rewritten file in its own globals, so that the
module built and diagnosed next runs the change without the user's file being touched."""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Owner:
    """Where a function lives: ``holder.name`` (a class or a module), as stored there (a
    staticmethod or classmethod as such), and the function itself."""

    holder: object
    name: str
    stored: object
    function: types.FunctionType

    @property
    def span(self) -> tuple[int, int]:
        return _span(self.function.__code__)


@functools.lru_cache(maxsize=1024)
def _span(code: types.CodeType) -> tuple[int, int]:
    """The first and last line of the source a function's code was compiled from (the user's
    file is never changed, so it is read once per function)."""
    lines, first = inspect.getsourcelines(code)
    return first, first + len(lines) - 1


def _functions(holder: object, path: Path, seen: set[int]) -> Iterator[Owner]:
    """The functions defined in ``path`` that ``holder`` (a module or a class) stores, its
    classes' (from ``path``) included."""
    if id(holder) in seen:
        return
    seen.add(id(holder))
    for name, stored in list(vars(holder).items()):
        function = stored.__func__ if isinstance(stored, staticmethod | classmethod) else stored
        function = inspect.unwrap(function) if callable(function) else function
        if isinstance(function, types.FunctionType) and _defined_in(function, path):
            yield Owner(holder, name, stored, function)
        elif isinstance(stored, type) and _class_in(stored, path):
            yield from _functions(stored, path, seen)


def _defined_in(function: types.FunctionType, path: Path) -> bool:
    try:
        return _resolved(function.__code__.co_filename) == path
    except OSError:
        return False


def _class_in(cls: type, path: Path) -> bool:
    file = _file_of(sys.modules.get(cls.__module__))
    return file is not None and _resolved(file) == path


@functools.lru_cache(maxsize=4096)
def _resolved(file: str) -> Path:
    """A module's or a function's file, its links followed (once per name: a diagnosis asks
    of every loaded module's file for each line it fixes)."""
    return Path(file).resolve()


def _file_of(module: object) -> str | None:
    """A module's file; None where it has none, or will not say (an import stub that raises)."""
    try:
        file = getattr(module, "__file__", None)
    except Exception:
        return None
    return file if isinstance(file, str) else None


def owners(path: Path, line: int) -> list[Owner]:
    """The running functions whose source holds ``line`` of ``path``: one per place that
    stores it (a file loaded twice, as a target and as an import, stores it twice; a def
    nested in another is part of the one its module or class stores)."""
    path = path.resolve()
    seen: set[int] = set()
    found = []
    for module in list(sys.modules.values()):
        file = _file_of(module)
        if file is None or _resolved(file) != path:
            continue
        for owner in _functions(module, path, seen):
            try:
                first, last = owner.span
            except (OSError, TypeError):
                continue
            if first <= line <= last:
                found.append(owner)
    return found


def recompiled(owner: Owner, source: str, path: Path, line: int) -> object | None:
    """``owner``'s function compiled again from ``source`` (the rewritten file) as its def
    statement makes it (decorators and all), in its own globals and with its class as
    ``__class__`` (so ``super()`` works), at its lines; None when the rewritten file has no
    such function there."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    name = owner.function.__name__
    defs = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name == name
        and node.lineno <= line <= (node.end_lineno or node.lineno)
    ]
    if not defs:
        return None
    definition = min(defs, key=lambda d: (d.end_lineno or d.lineno) - d.lineno)
    arguments = ast.arguments(
        posonlyargs=[], args=[ast.arg("__class__")], kwonlyargs=[], kw_defaults=[], defaults=[]
    )
    maker = ast.FunctionDef(
        name="_attention_doctor_fix",
        args=arguments,
        body=[definition, ast.Return(ast.Name(name, ast.Load()))],
        decorator_list=[],
    )
    for node in (maker, *ast.walk(maker.args), maker.body[1], *ast.walk(maker.body[1])):
        ast.copy_location(node, definition)  # the lines the rewritten file gives it
    module = ast.Module(body=[maker], type_ignores=[])
    try:
        code = compile(module, str(path), "exec")
        maker_code = next(c for c in code.co_consts if isinstance(c, types.CodeType))
        make = types.FunctionType(maker_code, owner.function.__globals__)
        return make(owner.holder if isinstance(owner.holder, type) else None)
    except Exception:  # a decorator or a default that only its class body could evaluate
        return None


@contextlib.contextmanager
def swapped(replacements: list[tuple[Owner, object]]) -> Iterator[None]:
    """Each owner's function replaced by its rewritten one, then put back."""
    done = []
    try:
        for owner, function in replacements:
            setattr(owner.holder, owner.name, function)
            done.append(owner)
        yield
    finally:
        for owner in reversed(done):
            setattr(owner.holder, owner.name, owner.stored)
