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


def frame(rows: list[Row]) -> pd.DataFrame:
    return pd.DataFrame(
        [[r.case, r.class_name, "yes" if r.built else "no", "yes" if r.ran else "no",
          verdict(r), f"{r.layers} ({r.groups} probed)" if r.ran else "",
          (r.known or r.evidence).replace("|", "\\|"), f"{r.seconds:.1f}"] for r in rows],
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
        f"run through the doctor ({100 * len(ran) / max(1, len(built)):.0f}%); "
        f"{len(attended)} with attention layers found",
        f"- healthy: {len(healthy)}; unhealthy: {len(unhealthy)}, of which {len(known)} with a "
        "reproduced, explained defect",
        f"- injected bugs caught on the probe named: {sum(r.caught for r in bugs)} of {len(bugs)}",
    ]
    return "\n".join(lines)


def markdown(rows: list[Row]) -> str:
    return "\n".join(["# The zoo", "", summary(rows), "",
                      frame(rows).to_markdown(index=False), ""])  # fmt: skip
