"""The report wing: the markdown diagnosis report, ``reports/report.md``, with its pictures.

build (the report command's work: measure, extras, learning, the doctor's tables) -> write
(report.md from its parts, the folder written as one unit) -> the parts of report.md, top to
bottom: opening, symptom_index, summary_table, traps, doctor_tables, appendix (and timings, the
file beside it) -> what they draw on: symptoms (the rules of the symptom index), learning (the
learning probe's blocks), extras (a trap's own tables), pictures, publish (the folder replaced as
one unit), diff (two reports compared within rounding noise) -> parse (a report read back for
diff) -> results (TrapResult, Grid) and format (what the writer writes and the comparer reads
back), the leaves.

The names below are imported when first used, so that ``harness.report.diff`` costs no
measurement, drawing or doctor import. None of them is also a submodule's name: importing that
submodule would hide it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.files import CLAIMS_PAGE, IMAGES, REPORT, TIMINGS
    from harness.report.appendix import measurement_tables, where
    from harness.report.build import build_report, collect
    from harness.report.format import table, verdict_label
    from harness.report.results import Grid, TrapResult
    from harness.report.summary_table import cosine_cell, entropy_cell, output_cell, summary
    from harness.report.traps import benign_statement, trap_section
    from harness.report.write import render, write_report

_HOMES = {
    "build_report": "build", "collect": "build",
    "render": "write", "write_report": "write",
    "TrapResult": "results", "Grid": "results",
    "summary": "summary_table", "output_cell": "summary_table", "entropy_cell": "summary_table",
    "cosine_cell": "summary_table",
    "trap_section": "traps", "benign_statement": "traps",
    "measurement_tables": "appendix", "where": "appendix",
    "table": "format", "verdict_label": "format",
}  # fmt: skip
_FILES = ("CLAIMS_PAGE", "IMAGES", "REPORT", "TIMINGS")  # a report folder's (harness.files)

__all__ = [
    "CLAIMS_PAGE",
    "IMAGES",
    "REPORT",
    "TIMINGS",
    "Grid",
    "TrapResult",
    "benign_statement",
    "build_report",
    "collect",
    "cosine_cell",
    "entropy_cell",
    "measurement_tables",
    "output_cell",
    "render",
    "summary",
    "table",
    "trap_section",
    "verdict_label",
    "where",
    "write_report",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in _FILES:
        return getattr(importlib.import_module("harness.files"), name)
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
