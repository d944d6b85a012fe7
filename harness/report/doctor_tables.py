"""report.md's doctor tables, before the appendix: the doctor on the catalogue (what it detects
of each trap), on real libraries' attention modules, and the zoo's summary; and the doctor on the
tutorial's own modules, which the report shows near its top."""

from __future__ import annotations

from pathlib import Path

from harness.realmodules import real_markdown, real_table
from harness.tutorial.own_code import diagnoses
from harness.validation import detection_markdown, detection_table
from harness.zoo.table import report_section as zoo_section

TABLES, TUTORIAL = "tables", "tutorial"  # the keys of doctor_sections' answer


def doctor_sections(out: Path) -> dict[str, object]:
    """The report's doctor tables (``TABLES``: the catalogue's detection table, the real
    modules' table and the zoo's summary, read from ``out``, else the committed one) and the
    doctor on the tutorial's modules (``TUTORIAL``, a table)."""
    doctor = detection_markdown(detection_table())
    doctor += "\n\n" + real_markdown(real_table())
    return {TABLES: doctor + "\n\n" + zoo_section(out), TUTORIAL: diagnoses()}
