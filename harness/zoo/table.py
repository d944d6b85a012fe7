"""The zoo's table from its rows: one line per case, then the summary the report quotes."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from harness.zoo.rows import Row

COLUMNS = ["case", "class", "built", "ran", "verdict", "layers", "evidence", "s"]


def read_rows(folder: Path) -> list[Row]:
    """Every row written to ``folder``, by case name."""
    return [Row(**json.loads(p.read_text())) for p in sorted(folder.glob("*.json"))]


def verdict(row: Row) -> str:
    if not row.built or not row.ran:
        return "-"
    if row.expected:
        return "caught" if row.caught else "MISSED"
    if row.healthy:
        return "healthy"
    return "known defect" if row.known else "UNHEALTHY"


def _evidence(row: Row) -> str:
    """What the row says: the explained defect of an architecture called unhealthy, else the
    first failure (or why it did not build or run)."""
    return row.known if row.known and verdict(row) == "known defect" else row.evidence


def frame(rows: list[Row]) -> pd.DataFrame:
    return pd.DataFrame(
        [[r.case, r.class_name, "yes" if r.built else "no", "yes" if r.ran else "no",
          verdict(r), f"{r.layers} ({r.groups} probed)" if r.ran else "",
          _evidence(r).replace("|", "\\|"), f"{r.seconds:.1f}"] for r in rows],
        columns=COLUMNS,
    )  # fmt: skip


def summary(rows: list[Row]) -> str:
    """Counts: built, ran, healthy, called unhealthy; injected bugs caught."""
    archs = [r for r in rows if not r.expected]
    bugs = [r for r in rows if r.expected]
    built = [r for r in archs if r.built]
    ran = [r for r in built if r.ran]
    healthy = [r for r in ran if r.healthy]
    unhealthy = [r for r in ran if not r.healthy]
    known = [r for r in unhealthy if r.known]
    attended = [r for r in ran if r.layers]
    lines = [
        f"- {len(archs)} architectures; {len(built)} build at the tiny size; {len(ran)} of them "
        f"run through the doctor ({100 * len(ran) / max(1, len(built)):.1f}%); "
        f"{len(attended)} with attention layers found",
        f"- healthy: {len(healthy)}; unhealthy: {len(unhealthy)}, of which {len(known)} with a "
        "reproduced, explained defect",
        f"- injected bugs caught on the probe named, naming the trap: "
        f"{sum(r.caught for r in bugs)} of {len(bugs)}",
    ]
    return "\n".join(lines)


def markdown(rows: list[Row]) -> str:
    return "\n".join(["# The zoo", "", summary(rows), "",
                      frame(rows).to_markdown(index=False), ""])  # fmt: skip


ZOO_FILE = "zoo.md"
# the zoo's table committed beside the report, for a report written elsewhere (a test's folder)
COMMITTED = Path(__file__).resolve().parents[2] / "reports" / ZOO_FILE


def report_section(out: Path) -> str:
    """The report's section on the zoo: its summary, read from the table the last zoo run
    wrote into ``out`` (else the committed one), and a link to the table; the zoo itself is a
    benchmark of minutes that the report does not run."""
    found = next((p for p in (out / ZOO_FILE, COMMITTED) if p.is_file()), None)
    lines = [
        "## The doctor on whole models: the zoo",
        "",
        "The model doctor (`python -m harness doctor MODEL`) over every text architecture of "
        "the installed transformers (its causal-LM and masked-LM auto-mappings, each built from "
        "its config class at the tiny size), and over bugs injected into several of them the "
        "way bug reports describe them. Run with `python -m harness zoo transformers` "
        "(pytest-xdist over the cores); not part of this report's run.",
        "",
    ]
    if found is None:
        return "\n".join([*lines, "Not run here."])
    summary = [line for line in found.read_text().splitlines() if line.startswith("- ")]
    return "\n".join([*lines, *summary, "", f"The table, case by case: [{ZOO_FILE}]({ZOO_FILE})."])
