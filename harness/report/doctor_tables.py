"""report.md's doctor tables, before the appendix: the doctor on the catalogue (what it detects
of each trap), on real libraries' attention modules, and the zoo's summary; and the doctor on the
tutorial's own modules, which the report shows near its top."""

from __future__ import annotations

from pathlib import Path

from harness.realmodules import real_markdown, real_table
from harness.tutorial.own_code import diagnoses
from harness.validation import detection_markdown, detection_table
from harness.zoo.table import report_section as zoo_section

TABLES, TUTORIAL = "tables", "tutorial"  # the keys of assembled's answer
DETECTION = "detection"  # on_the_catalogue's table, beside TUTORIAL


def on_the_catalogue() -> dict[str, object]:
    """What changes with the catalogue's files: the doctor on every pair (``DETECTION``, its
    markdown table) and on the tutorial's modules (``TUTORIAL``, a table)."""
    return {DETECTION: detection_markdown(detection_table()), TUTORIAL: diagnoses()}


def on_libraries() -> str:
    """What changes with the harness and the libraries only: the doctor on real libraries'
    attention modules, a markdown table."""
    return real_markdown(real_table())


def assembled(catalogue: dict[str, object], libraries: str, out: Path) -> dict[str, object]:
    """The report's doctor sections from their two pieces: the tables (``TABLES``: detection,
    real modules, and the zoo's summary, read from ``out``, else the committed one) and the
    tutorial's table (``TUTORIAL``)."""
    tables = [catalogue[DETECTION], libraries, zoo_section(out)]
    return {TABLES: "\n\n".join(map(str, tables)), TUTORIAL: catalogue[TUTORIAL]}
