"""What expressions are worth at a line of the user's source when it runs: the code run once
under a tracer that, the first time the line is reached, evaluates them in its frame. A fix
that puts one size for another picks the sizes there are, not names that sound like one."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FrameType

import torch


def values_at(path: Path, number: int, expressions: Iterable[str],
              run: Callable[[], object]) -> dict[str, object]:  # fmt: skip
    """Each expression's value the last time line ``number`` of ``path`` runs in ``run()``
    (the call itself, after whatever ``run`` calls first to learn how to call; left out where
    it cannot be evaluated there); {} when the line never runs."""
    found: dict[str, object] = {}

    def seen(frame: FrameType) -> None:
        if frame.f_lineno == number:
            found.clear()
            for expression in expressions:
                try:
                    found[expression] = eval(expression, frame.f_globals, dict(frame.f_locals))
                except Exception:
                    continue

    _each_line(path, run, seen)
    return found


def lines_run(path: Path, run: Callable[[], object]) -> set[int]:
    """The line numbers of ``path`` that run in ``run()`` (a branch the call never takes is
    not among them)."""
    ran: set[int] = set()
    _each_line(path, run, lambda frame: ran.add(frame.f_lineno))
    return ran


def _each_line(path: Path, run: Callable[[], object], seen: Callable[[FrameType], None]) -> None:
    """``run()``, with ``seen(frame)`` called as each line of ``path`` is about to run (what
    ran before an error is what there is: the error is not raised)."""
    wanted = os.path.realpath(path)
    ours: dict[str, bool] = {}

    def in_frame(frame: FrameType, event: str, arg: object) -> object:
        if event == "line":
            seen(frame)
        return in_frame

    def on_call(frame: FrameType, event: str, arg: object) -> object:
        name = frame.f_code.co_filename
        if name not in ours:  # realpath once a file: every frame of torch's passes here
            ours[name] = os.path.realpath(name) == wanted
        return in_frame if ours[name] else None

    before = sys.gettrace()
    sys.settrace(on_call)
    try:
        run()
    except Exception:
        pass
    finally:
        sys.settrace(before)


def steady(first: dict[str, object], second: dict[str, object]) -> dict[str, object]:
    """The values of ``first`` that ``second`` (the code run on another length) agrees with:
    numbers equal, anything else the same object or equal; those that move are left out."""
    kept = {}
    for expression, value in first.items():
        other = second.get(expression, _ABSENT)
        if number_of(value) is not None or number_of(other) is not None:
            if number_of(value) == number_of(other):
                kept[expression] = value
        elif other is value:
            kept[expression] = value
    return kept


_ABSENT = object()


def number_of(value: object) -> float | None:
    """A Python number or a one-element tensor as a float, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.item())
    return None
