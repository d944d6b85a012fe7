"""The lesson of a pair: the unified diff of buggy.py against fixed.py, and its size."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

MARKERS = {"-": "# BUG", "+": "# FIX"}


@dataclass(frozen=True)
class DiffLine:
    side: str  # "-" (buggy.py) or "+" (fixed.py)
    text: str


def unified_diff(folder: Path, context: int = 3) -> str:
    """``diff -u buggy.py fixed.py`` for one trap folder."""
    buggy = (folder / "buggy.py").read_text().splitlines(keepends=True)
    fixed = (folder / "fixed.py").read_text().splitlines(keepends=True)
    return "".join(difflib.unified_diff(buggy, fixed, "buggy.py", "fixed.py", n=context))


def changed(folder: Path) -> list[DiffLine]:
    """Every line that differs between the two files, with its side."""
    diff = unified_diff(folder, context=0).splitlines()
    return [
        DiffLine(line[0], line[1:])
        for line in diff
        if line[:1] in MARKERS and not line.startswith(("---", "+++"))
    ]


def changed_line_count(folder: Path) -> int:
    """Lines changed: for each hunk the larger of lines removed and lines added, summed.

    A line replaced by another counts once; an added or removed line counts once.
    """
    total, removed, added = 0, 0, 0
    for line in unified_diff(folder, context=0).splitlines()[2:]:
        if line.startswith("@@"):
            total += max(removed, added)
            removed = added = 0
        elif line.startswith("-"):
            removed += 1
        elif line.startswith("+"):
            added += 1
    return total + max(removed, added)


def unmarked(folder: Path) -> list[DiffLine]:
    """Changed lines that do not carry their side's marker (# BUG in buggy, # FIX in fixed)."""
    return [d for d in changed(folder) if MARKERS[d.side] not in d.text]
