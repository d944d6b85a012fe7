"""Which page of the report folder holds what (``harness.files.PAGES``): the student's page
(``report.md``) holds no trap's section; the tutorial's page holds the tutorial's traps and the
traps its claims are measured by or lead to, the others follow by kind. A link from one page to
a trap on another names that page."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness.catalogue.card import NOT_NAMED
from harness.files import CLAIMS_PAGE, MODERN, MORE_TRAPS, PAGES, REPORT
from harness.report.format import link
from harness.report.results import TrapResult
from harness.report.scorecard import CLAIMS


def student_traps(results: list[TrapResult]) -> set[str]:
    """The traps of the student's page: those the tutorial names, and those the scorecard's
    claims are measured by or lead to."""
    named = {r.pair.card.id for r in results if r.pair.card.section != NOT_NAMED}
    return named | {t for claim in CLAIMS for t in (claim.trap, claim.leads_to) if t}


def trap_pages(results: list[TrapResult]) -> dict[str, str]:
    """Each trap's page."""
    student = student_traps(results)
    return {
        r.pair.card.id: CLAIMS_PAGE
        if r.pair.card.id in student
        else MODERN
        if r.pair.card.modern
        else MORE_TRAPS
        for r in results
    }


def linker(results: list[TrapResult], here: str = REPORT) -> Callable[[str], str]:
    """``link`` for the page ``here``: a trap on another page is linked with its page's
    name."""
    pages = trap_pages(results)

    def to(pitfall: str) -> str:
        page = pages.get(pitfall, here)
        return link(pitfall, "" if page == here else page)

    return to


def read_pages(folder: Path) -> dict[str, str]:
    """The pages a report folder holds, by name."""
    return {name: (folder / name).read_text() for name in PAGES if (folder / name).is_file()}


def joined(pages: dict[str, str]) -> str:
    """The pages as one text, in reading order: what the comparer reads."""
    return "\n".join(pages[name] for name in PAGES if name in pages)
