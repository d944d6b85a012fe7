"""report.md's summary: one row per trap (its verdict per cell, combined and expected, the bug's
output error, entropy and gradient cosine, and whether it learns), then a note on the verdicts
that differ in low precision and where learning disagrees with one pass."""

from __future__ import annotations

import pandas as pd

from harness.catalogue.judge import Measurement
from harness.catalogue.spread import SEEDS
from harness.files import CLAIMS_PAGE
from harness.report import learning
from harness.report.format import (
    LEARNED_COLUMN,
    OUTPUT_COLUMN,
    SUMMARY,
    num,
    over_seeds,
    seeds_column,
    verdict_label,
)
from harness.report.pages import linker
from harness.report.results import TrapResult


def output_cell(m: Measurement) -> str:
    """The bug's output error over the largest |value| of the reference output (the scale it
    is an error of), then the floor; or why there is none."""
    s = m.summary()
    if m.seeds:
        return "n/a (over seeds)"
    if m.raised:
        return "raises"
    ref = m.outputs.get("ref")
    scale = f" / {num(ref.abs().max().item())}" if ref is not None else ""
    return f"{num(s['err_bug'])}{scale} ({num(s['floor'])})"


def entropy_cell(m: Measurement) -> str:
    """Mean entropy of each module's rows; n/a where a module returns no weights or raises; the
    NaN rows the mean leaves out, where buggy.py has more than fixed.py."""
    s = m.summary()
    fix, bug = (num(s[k]) if pd.notna(s[k]) else "n/a" for k in ("entropy_fix", "entropy_bug"))
    if fix == bug == "n/a":
        return "n/a"
    nan_rows = m.attention.set_index("run")["nan_rows"]
    extra = int(nan_rows["bug"] - nan_rows["fix"]) if nan_rows.notna().all() else 0
    return f"{fix} → {bug}" + (f" (+{extra} NaN rows)" if extra > 0 else "")


def cosine_cell(m: Measurement) -> str:
    """The smallest gradient cosine; NaN when a buggy gradient holds NaN, n/a when unmeasured."""
    grads = m.gradients
    if "nonfinite_bug" in grads and (grads["nonfinite_bug"] > 0).any():
        return "NaN"
    cosine = m.summary()["grad_cosine_min"]
    return num(cosine) if pd.notna(cosine) else "n/a"


def summary(results: list[TrapResult]) -> str:
    devices = list(dict.fromkeys(m.device for r in results for m in r.cells))
    rows, to = [], linker(results, here=CLAIMS_PAGE)
    for r in results:
        row = {"trap": to(r.pair.card.id), "§": r.pair.card.section}
        for device in devices:
            here = [m for m in r.cells if m.device == device]
            header = f"{device}: " + " · ".join(m.dtype for m in here)
            row[header] = " · ".join(verdict_label(m.verdict, [m]) for m in here)
        row |= {
            "combined": verdict_label(r.overall(r.primary.device), r.cells),
            "expected": str(r.pair.card.expected),
            OUTPUT_COLUMN: output_cell(r.primary),
            seeds_column(SEEDS): "n/a" if r.spread is None else over_seeds(r.spread),
            "entropy fix → bug": entropy_cell(r.primary),
            "grad cosine": cosine_cell(r.primary),
        }
        if r.learning is not None:
            row[LEARNED_COLUMN] = learning.learns_cell(r.learning)
        rows.append(row)
    table = pd.DataFrame(rows).to_markdown(index=False, disable_numparse=True)  # cells are text
    differing = [
        f"`{r.pair.card.id}` ({'; '.join(f'{m.cell}: {m.verdict}' for m in low)})"
        for r in results
        if (low := [m for m in r.cells if m.verdict is not r.primary.verdict])
    ]
    note = (
        "Verdicts that differ in low precision from the full-precision one: "
        + ", ".join(differing)
        + ". The sections say why (an error only float16 raises, or a range it lacks)."
        if differing
        else "Every trap gets the same verdict in every dtype measured."
    )
    learned = [(r.pair.card, r.overall(r.primary.device), r.learning) for r in results]
    if rows_learned := [(c, v, lr) for c, v, lr in learned if lr is not None]:
        note += "\n\n" + learning.findings_note(rows_learned)
    return f"{SUMMARY}\n\n" + table + "\n\n" + note
