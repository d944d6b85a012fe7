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
    wanted = os.path.realpath(path)
    ours: dict[str, bool] = {}
    found: dict[str, object] = {}

    def in_frame(frame: FrameType, event: str, arg: object) -> object:
        if event == "line" and frame.f_lineno == number:
            found.clear()
            for expression in expressions:
                try:
                    found[expression] = eval(expression, frame.f_globals, dict(frame.f_locals))
                except Exception:
                    continue
        return in_frame

    def on_call(frame: FrameType, event: str, arg: object) -> object:
        name = frame.f_code.co_filename
        if name not in ours:
            ours[name] = os.path.realpath(name) == wanted
        return in_frame if ours[name] else None

    before = sys.gettrace()
    sys.settrace(on_call)
    try:
        run()
    except Exception:
        pass  # what it reached before it broke is what there is
    finally:
        sys.settrace(before)
    return found


def lines_run(path: Path, run: Callable[[], object]) -> set[int]:
    """The line numbers of ``path`` that run in ``run()`` (a branch the call never takes is
    not among them)."""
    wanted = os.path.realpath(path)
    ran: set[int] = set()
    ours: dict[str, bool] = {}

    def in_frame(frame: FrameType, event: str, arg: object) -> object:
        if event == "line":
            ran.add(frame.f_lineno)
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
        pass  # what ran before it broke is what ran
    finally:
        sys.settrace(before)
    return ran


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
