"""report.md's doctor tables, before the appendix: the doctor on the catalogue (what it detects
of each trap), on real libraries' attention modules, and the zoo's summary."""

from __future__ import annotations

from pathlib import Path

from harness.realmodules import real_markdown, real_table
from harness.validation import detection_markdown, detection_table
from harness.zoo.table import report_section as zoo_section


def doctor_sections(out: Path) -> str:
    """The report's doctor tables: the catalogue's detection table, the real modules' table
    and the zoo's summary (read from ``out``, else the committed one)."""
    doctor = detection_markdown(detection_table())
    doctor += "\n\n" + real_markdown(real_table())
    return doctor + "\n\n" + zoo_section(out)
