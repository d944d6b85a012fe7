"""What expressions are worth at a line of the user's source when it runs: the code run once
under a tracer that, the first time the line is reached, evaluates them in its frame. A fix
that puts one size for another picks the sizes there are, not names that sound like one."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FrameType


def values_at(path: Path, number: int, expressions: Iterable[str],
              run: Callable[[], object]) -> dict[str, object]:  # fmt: skip
    """Each expression's value the first time line ``number`` of ``path`` runs in ``run()``
    (left out where it cannot be evaluated there); {} when the line never runs."""
    wanted = os.path.realpath(path)
    ours: dict[str, bool] = {}
    found: dict[str, object] = {}
    reached = False

    def in_frame(frame: FrameType, event: str, arg: object) -> object:
        nonlocal reached
        if event == "line" and frame.f_lineno == number and not reached:
            reached = True
            for expression in expressions:
                try:
                    found[expression] = eval(expression, frame.f_globals, dict(frame.f_locals))
                except Exception:
                    continue
        return in_frame

    def on_call(frame: FrameType, event: str, arg: object) -> object:
        if reached:
            return None
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
