"""report.md from its parts, top to bottom, and writing the report folder: the pictures drawn and
named by their bytes, report.md and timings.md staged, then put in place as one unit (``publish``)
unless the report already there says the same within rounding noise (``diff``).

Everything in ``report.md`` is deterministic for a given command on a given machine; wall-clock
numbers go to ``timings.md`` beside it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from harness.files import IMAGES, REPORT, TIMINGS, ensure_writable
from harness.interrupts import uninterrupted
from harness.report import diff, publish, store
from harness.report.appendix import appendix
from harness.report.opening import opening
from harness.report.results import Grid, TrapResult
from harness.report.store import Store
from harness.report.summary_table import summary
from harness.report.symptom_index import symptom_index
from harness.report.timings import timings_text
from harness.report.traps import category_sections


def render(
    results: list[TrapResult],
    grid: Grid,
    unavailable: list[str],
    timed: set[str],
    images: dict[str, list[str]],
    doctor: str | None,
) -> str:
    """The whole report.md."""
    cards = [r.pair.card for r in results]
    sections = [
        opening(grid, unavailable, cards, any(r.learning is not None for r in results)),
        symptom_index(results, timed),
        summary(results),
        category_sections(results, images),
    ]
    if doctor is not None:
        sections.append(doctor)
    sections.append(appendix(results))
    return "\n\n".join(sections).rstrip("\n") + "\n"


def draw(r: TrapResult, folder: Path) -> list[str]:
    """``pictures.draw``, imported on first use: a run whose pictures the store keeps never
    loads matplotlib."""
    from harness.report.pictures import draw as draw_pictures

    return draw_pictures(r, folder)


def drawn_or_kept(r: TrapResult, staged: Path, kept: Store) -> list[str]:
    """``draw`` the trap's pictures into ``staged``, or write the ones the store keeps for the
    same result (its key); their names, as ``draw`` gives them."""
    key = store.key("pictures", r.key) if r.key else ""
    pictures = kept.get(key) if key else None
    if isinstance(pictures, dict):
        for name, data in pictures.items():
            (staged / name).write_bytes(data)
        return list(pictures)
    drawn = draw(r, staged)
    if key:
        kept.put(key, {name: (staged / name).read_bytes() for name in drawn})
    return drawn


def write_report(
    results: list[TrapResult],
    grid: Grid,
    out: Path,
    unavailable: list[str],
    timed: dict[str, pd.DataFrame],
    doctor: str | None = None,
    progress: Callable[[str], None] = lambda label: None,
    kept: Store | None = None,
) -> tuple[Path, bool]:
    """Write ``out/report.md`` with its pictures, and ``out/timings.md``, as one unit.

    When ``out`` already holds a report that agrees with this one within rounding noise (and
    every picture it links), it is kept as it is: a machine that differs only in its CPU leaves
    a committed report unchanged. Returns the report's path and whether it was replaced.
    ``doctor`` is an optional section before the appendix (the doctor's tables).
    """
    ensure_writable(out)
    with publish.staging(out) as staged:
        (staged / IMAGES).mkdir()
        images = {}
        for r in results:
            progress(f"drawing {r.pair.card.id}")
            drawn = drawn_or_kept(r, staged, kept or Store(None))
            hashed = [publish.hashed_name(staged / name) for name in drawn]
            for name, new in zip(drawn, hashed, strict=True):
                os.replace(staged / name, staged / new)
            images[r.pair.card.id] = hashed
        progress("writing")
        text = render(results, grid, unavailable, set(timed), images, doctor)
        (staged / REPORT).write_text(text)
        (staged / TIMINGS).write_text(timings_text(timed))
        pictures = [name for names in images.values() for name in names]
        with publish.locked(out):
            old = out / REPORT
            old_text = old.read_text() if old.is_file() else None
            if is_current(out, old_text, text):
                with uninterrupted(f"{out / TIMINGS} was replaced (the report was current)"):
                    os.replace(staged / TIMINGS, out / TIMINGS)
                return out / REPORT, False
            linked = publish.linked_images(old_text or "")
            with uninterrupted(f"{out / REPORT} is the new report"):
                publish.install(staged, out, REPORT, pictures, [TIMINGS], linked)
    return out / REPORT, True


def is_current(out: Path, old_text: str | None, text: str) -> bool:
    """The report ``out`` holds (``old_text``; None: none) is equivalent to ``text``
    (``diff.equivalent``), with every picture it links."""
    if old_text is None:
        return False
    pictures = publish.linked_images(old_text)
    return all((out / p).is_file() for p in pictures) and diff.equivalent(old_text, text)
