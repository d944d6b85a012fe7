"""A trap's tables beyond its measurement: a cached scenario's error per position, or what its
card's own experiment measures (a sweep, a timing); where each is shown and under what caption.

A short table stays in the trap's section, a long one goes to the appendix; a table may ask for
line plots (``attrs["plots"]``, drawn by ``pictures``).
"""

from __future__ import annotations

import pandas as pd

from harness.catalogue.card import Card
from harness.catalogue.judge import Measurement
from harness.consistency import position_errors
from harness.scenarios import bounds

SHORT = 12  # a trap-specific table of at most this many rows stays in its section


def is_short(df: pd.DataFrame) -> bool:
    return len(df) <= SHORT


def caption(extra: pd.DataFrame) -> str:
    return extra.attrs.get("caption", "Trap-specific measurement")


def generation_steps(m: Measurement, card: Card) -> pd.DataFrame:
    """A cached scenario's error against the full forward in float64, per position."""
    ref = m.outputs["ref"]
    table = pd.DataFrame({"position": range(ref.shape[1])})
    for name, label in (("fix", "fixed.py"), ("bug", "buggy.py")):
        errors = position_errors(m.outputs.get(name), ref)
        table[f"max error ({label})"] = float("nan") if errors is None else errors.tolist()
    prefill = bounds(card.how.steps, ref.shape[1])[0][1]
    table["call"] = ["prefill" if t < prefill else "step" for t in table["position"]]
    table.attrs["caption"] = f"Error per position against the full forward ({card.scenario})"
    table.attrs["plots"] = [
        dict(
            x="position",
            y=["max error (fixed.py)", "max error (buggy.py)"],
            logy=True,
            title=f"{card.id}: {card.scenario} vs the full forward (float64)",
            xlabel=f"position (0-{prefill - 1}: prefill; then the cached calls)",
            ylabel="max |error|",
        )
    ]
    return table
