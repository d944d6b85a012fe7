"""report.md's doctor tables, before the appendix: the doctor on the catalogue (what it detects
of each trap, and of two reference modules), on real libraries' attention modules, and the zoo's
summary; and the doctor on the tutorial's own modules, which the report shows near its top.

A trap's rows of the detection table are measured with the trap (``detection_rows``, kept in
its store entry), so a changed pair file re-diagnoses that pair alone; the rest are pieces of
their own (``harness.report.build.DOCTOR_PIECES``): the reference modules' rows
(``reference_rows``), the tutorial's table (``diagnoses``) and real libraries' (below)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from harness.realmodules import real_markdown, real_table
from harness.validation import DetectionRow, detection_markdown
from harness.zoo.table import report_section as zoo_section

TABLES, TUTORIAL = "tables", "tutorial"  # the keys of assembled's answer


def on_libraries() -> str:
    """What changes with the harness and the libraries only: the doctor on real libraries'
    attention modules, a markdown table."""
    return real_markdown(real_table())


def assembled(
    detection: list[DetectionRow], pieces: dict[str, object], out: Path
) -> dict[str, object]:
    """The report's doctor sections: the tables (``TABLES``: detection, from every trap's rows
    (``detection``, in the catalogue's order) and the references', real modules, and the zoo's
    summary, read from ``out``, else the committed one) and the tutorial's table
    (``TUTORIAL``). ``pieces`` holds the answers of ``diagnoses``, ``reference_rows`` and
    ``on_libraries`` under "tutorial", "references" and "libraries"."""
    references = pieces["references"]
    assert isinstance(references, list)
    table = pd.DataFrame([*detection, *references])
    tables = [detection_markdown(table), pieces["libraries"], zoo_section(out)]
    return {TABLES: "\n\n".join(map(str, tables)), TUTORIAL: pieces["tutorial"]}
