"""report.md's appendix: for each trap, the tables behind its verdict (output, attention rows,
gradients of its primary cell) and its long extra tables."""

from __future__ import annotations

import pandas as pd

from harness.catalogue.card import Card
from harness.catalogue.judge import EDGE_NAMES, Measurement
from harness.report.extras import caption, is_short
from harness.report.format import TABLES, anchor, table
from harness.report.results import TrapResult

OUTPUT_COLUMNS = ["run", "max_abs", "rel_l2", "threshold", "differs", "shape"]
ATTENTION_COLUMNS = ["run", "entropy_mean", "entropy_min", "saturated", "nan_rows", "row_sum_err"]
GRADIENT_COLUMNS = ["param", "norm_fix", "norm_bug", "cosine", "err_fix", "err_bug", "threshold",
                    "differs"]  # fmt: skip

APPENDIX_INTRO = """\
# The tables behind each verdict

Part of the diagnosis report ([report.md](report.md)).

Each trap's tables come from its first device in float32 (the cell its section names). Output:
*run* is fixed.py (`fix`) or buggy.py (`bug`); *max_abs* the largest absolute error against the
float64 run (fix's is the floor); *rel_l2* the error's L2 norm over the reference's; *threshold*
2 x floor + atol; *differs* whether max_abs exceeds it; *shape* the output's. Attention rows:
*entropy_mean* and *entropy_min* over rows (normalized as report.md defines entropy); *saturated*
the fraction of rows with one weight of at least 0.99; *nan_rows* rows holding a NaN;
*row_sum_err* the largest distance of a row's sum from 1 (1 where a module zeroes a row with no
allowed key, as fully_masked_row's fixed.py does on purpose). Gradients, one row per weight and
for the input: *norm_fix* and *norm_bug* their L2 norms; *cosine* between the two; *err_fix* and
*err_bug* the largest errors against the float64 gradient; *threshold* 3 x err_fix + atol;
*differs* as above."""


def where(m: Measurement, card: Card) -> str:
    """Which cell, shape and inputs a measurement's tables come from."""
    text = f"{m.cell}, {m.shape.label()}"
    if m.edge:
        text += f", with {EDGE_NAMES[card.edge]}"
        text += f" (x scaled by {card.input_scale:g})" if card.edge == "large" else ""
    return text


def columns(df: pd.DataFrame, wanted: list[str]) -> pd.DataFrame:
    return df[[c for c in wanted if c in df.columns]]


def measurement_tables(m: Measurement, card: Card) -> list[str]:
    if m.seeds:
        return [
            f"Compared over {m.seeds} seeds, each module freshly initialised ({where(m, card)}): "
            "the bug is the weights, so outputs are not compared with each other.",
            "",
            "Attention rows, averaged over seeds:",
            "",
            table(m.attention),
            "",
            "Gradient norms, averaged over seeds:",
            "",
            table(m.gradients),
            "",
        ]
    if m.raised:
        return [f"On {where(m, card)} buggy.py raises: `{m.error}`", ""]
    return [
        f"Output against the float64 reference ({where(m, card)}):",
        "",
        table(columns(m.output, OUTPUT_COLUMNS)),
        "",
        *attention_table(m),
        "Gradients (a norm is NaN when the gradient holds a NaN, or the module has no such "
        "weight):",
        "",
        table(columns(m.gradients, GRADIENT_COLUMNS)),
        "",
    ]


def attention_table(m: Measurement) -> list[str]:
    att = columns(m.attention, ATTENTION_COLUMNS)
    if att.drop(columns="run").isna().all(axis=None):
        return ["Attention rows: neither module returns attention weights.", ""]
    return ["Attention rows:", "", table(att), ""]


def appendix(results: list[TrapResult]) -> str:
    parts = [APPENDIX_INTRO]
    for r in results:
        card, m = r.pair.card, r.primary
        out = [anchor(f"{TABLES}{card.id}"), f"### Tables: `{card.id}`", ""]
        out += measurement_tables(m, card)
        for extra in (e for e in r.extras if not is_short(e)):
            out += [f"{caption(extra)} ({m.cell}):", "", table(extra), ""]
        parts.append("\n".join(out).rstrip("\n"))
    return "\n\n".join(parts)
