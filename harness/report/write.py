"""report.md from its parts, top to bottom, and writing the report folder: the pictures drawn and
named by their bytes, report.md and timings.md staged, then put in place as one unit (``publish``)
unless the report already there says the same within rounding noise (``diff``).

Everything in ``report.md`` is deterministic for a given command on a given machine; wall-clock
numbers go to ``timings.md`` beside it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from harness.errors import UsageError, shorten
from harness.files import (
    CLAIMS_PAGE,
    DOCTOR,
    IMAGES,
    MODERN,
    MORE_TRAPS,
    PAGES,
    REPORT,
    TABLES_PAGE,
    TIMINGS,
    ensure_writable,
)
from harness.interrupts import uninterrupted
from harness.report import diff, publish, store
from harness.report.appendix import appendix
from harness.report.doctor_tables import TABLES, TUTORIAL
from harness.report.opening import CLAIMS_INTRO, how_to_read, opening, read_on, reproduce
from harness.report.pages import joined, linker, read_pages, trap_pages
from harness.report.results import Grid, TrapResult
from harness.report.scorecard import claims_measured_here, scorecard
from harness.report.store import Store
from harness.report.summary_table import summary
from harness.report.symptom_index import symptom_index, symptom_summary
from harness.report.timings import draw_timings, timings_text
from harness.report.traps import MORE_INTRO, category_sections, modern_sections
from harness.report.tutorial_code import check_your_own, tutorial_code

DOCTOR_INTRO = """\
# The doctor

Part of the diagnosis report ([report.md](report.md)): `python -m harness doctor` on every pair
of the catalogue, on real libraries' attention modules, and on whole models."""


def render(
    results: list[TrapResult],
    grid: Grid,
    unavailable: list[str],
    timed: set[str],
    images: dict[str, list[str]],
    doctor: dict[str, object] | None,
) -> dict[str, str]:
    """Every page of the report (``harness.files.PAGES``), by name."""
    cards = [r.pair.card for r in results]
    learned = any(r.learning is not None for r in results)
    doctor = doctor or {}
    page = trap_pages(results)
    on = {name: [r for r in results if page[r.pair.card.id] == name] for name in PAGES}
    student = [
        opening(),
        scorecard(results, linker(results)),
        tutorial_code(doctor.get(TUTORIAL)),
        symptom_summary(results, timed),
        check_your_own(),
        read_on(),
    ]
    claims_page = [
        CLAIMS_INTRO,
        how_to_read(learned),
        claims_measured_here(),
        symptom_index(results, timed),
        summary(results),
        category_sections(on[CLAIMS_PAGE], images),
        reproduce(grid, unavailable, cards, learned),
    ]
    pages = {REPORT: student, CLAIMS_PAGE: claims_page}
    if on[MORE_TRAPS]:
        pages[MORE_TRAPS] = [MORE_INTRO, category_sections(on[MORE_TRAPS], images)]
    if on[MODERN]:
        pages[MODERN] = [modern_sections(on[MODERN], images)]
    if TABLES in doctor:
        pages[DOCTOR] = [DOCTOR_INTRO, doctor[TABLES]]
    pages[TABLES_PAGE] = [appendix(results)]
    return {name: "\n\n".join(parts).rstrip("\n") + "\n" for name, parts in pages.items()}


def draw(r: TrapResult, folder: Path) -> list[str]:
    """``pictures.draw``, imported on first use: a run whose pictures the store keeps never
    loads matplotlib."""
    from harness.report.pictures import draw as draw_pictures

    return draw_pictures(r, folder)


def drawn_bytes(r: TrapResult) -> dict[str, bytes]:
    """The trap's pictures, drawn apart (by a worker), by name as ``draw`` gives them."""
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        (folder / IMAGES).mkdir()
        return {p: (folder / p).read_bytes() for p in draw(r, folder)}


def drawn_or_kept(r: TrapResult, staged: Path, kept: Store) -> list[str]:
    """``draw`` the trap's pictures into ``staged``, or write the ones drawn already
    (``r.pictures``) or the ones the store keeps for the same result (its key); their names, as
    ``draw`` gives them."""
    key = store.key("pictures", r.key) if r.key else ""
    pictures = r.pictures if r.pictures is not None else kept.get(key) if key else None
    if isinstance(pictures, dict):
        if key and r.pictures is not None:
            kept.put(key, pictures)
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
    doctor: dict[str, object] | None = None,
    progress: Callable[[str], None] = lambda label: None,
    kept: Store | None = None,
    pages_key: str = "",
    published: Callable[[], None] = lambda: None,
) -> tuple[Path, bool]:
    """Write the report's pages (``out/report.md`` and its companions) with their pictures, and
    ``out/timings.md``, as one unit.

    When ``out`` already holds a report that agrees with this one within rounding noise (and
    every picture it links), it is kept as it is: a machine that differs only in its CPU leaves
    a committed report unchanged. Returns the report's path and whether it was replaced.
    ``doctor`` is ``doctor_tables.assembled``'s answer, when the doctor ran. The pages
    are taken from the store ``kept`` under ``pages_key`` (a key of everything they are
    rendered from) when it holds them. ``published`` runs once the folder is as this run leaves
    it, still holding the folder's lock (the receipt of the run: no other run's report can come
    between).
    """
    ensure_writable(out)
    kept = kept or Store(None)
    with publish.staging(out) as staged:
        try:
            pictures, pages, timing_pictures = staged_report(
                results, grid, unavailable, timed, doctor, progress, kept, pages_key, staged
            )
        except OSError as exc:  # a full disk, a folder gone: nothing of this run is in place
            reason = exc.strerror or str(exc)
            raise UsageError(
                f"cannot write the report into {shorten(out, quote=True)}: {reason} (the folder "
                "holds what it held before this run)"
            ) from None

        def leave() -> None:  # the folder as this run leaves it, its lock still held
            shutil.rmtree(staged, ignore_errors=True)
            published()

        with publish.locked(out):
            old = read_pages(out)
            old_text = joined(old) if REPORT in old else None
            if is_current(out, old_text, joined(pages)) and set(old) == set(pages):
                with uninterrupted(f"{out / TIMINGS} was replaced (the report was current)"):
                    for name in [*timing_pictures, TIMINGS]:
                        os.replace(staged / name, out / name)
                leave()
                return out / REPORT, False
            linked = publish.linked_images(old_text or "")
            companions = [name for name in pages if name != REPORT]
            with uninterrupted(f"{out / REPORT} is the new report"):
                others = [*timing_pictures, TIMINGS, *companions]
                publish.install(staged, out, REPORT, pictures, others, linked)
                for name in set(old) - set(pages):  # a page this report does not have
                    (out / name).unlink()
            leave()
    return out / REPORT, True


def staged_report(
    results: list[TrapResult],
    grid: Grid,
    unavailable: list[str],
    timed: dict[str, pd.DataFrame],
    doctor: dict[str, object] | None,
    progress: Callable[[str], None],
    kept: Store,
    pages_key: str,
    staged: Path,
) -> tuple[list[str], dict[str, str], list[str]]:
    """Draw and render the report into the folder ``staged``: its pictures' names, its pages
    by name, and its timing pictures."""
    (staged / IMAGES).mkdir()
    images = {}
    for r in results:
        progress(f"drawing {r.pair.card.id}")
        drawn = drawn_or_kept(r, staged, kept)
        hashed = [publish.hashed_name(staged / name) for name in drawn]
        for name, new in zip(drawn, hashed, strict=True):
            os.replace(staged / name, staged / new)
        images[r.pair.card.id] = hashed
    progress("writing")
    pages = kept.get(pages_key) if pages_key else None
    if not isinstance(pages, dict):
        pages = render(results, grid, unavailable, set(timed), images, doctor)
        if pages_key:
            kept.put(pages_key, pages)
    for name, page in pages.items():
        (staged / name).write_text(page)
    (staged / TIMINGS).write_text(timings_text(timed))
    timing_pictures = draw_timings(timed, staged, kept)
    pictures = [name for names in images.values() for name in names]
    return pictures, pages, timing_pictures


def is_current(out: Path, old_text: str | None, text: str) -> bool:
    """The report ``out`` holds (``old_text``, its pages joined; None: none) is equivalent to
    ``text``
    (``diff.equivalent``), with every picture it links."""
    if old_text is None:
        return False
    pictures = publish.linked_images(old_text)
    present = all((out / p).is_file() for p in pictures)
    return present and (old_text == text or diff.equivalent(old_text, text))
