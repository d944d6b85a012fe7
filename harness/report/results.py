"""What the report shows of one trap: the leaf of the report wing, which every part that renders
a trap imports and which imports none of them."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from harness.catalogue.card import Pair
from harness.catalogue.judge import Grid, Measurement
from harness.catalogue.spread import Spread
from harness.catalogue.verdicts import FULL_PRECISION, Verdict, combine
from harness.learning import Learning

__all__ = ["Grid", "TrapResult"]


@dataclass
class TrapResult:
    """Everything the report shows for one trap."""

    pair: Pair
    cells: list[Measurement]  # one per (device, dtype)
    extras: list[pd.DataFrame] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    learning: Learning | None = None  # the learning probe, unless the report skips it
    spread: Spread | None = None  # the primary cell's output error over seeds
    key: str = ""  # what made it, in the store (harness.report.store): "" when not kept
    pictures: dict[str, bytes] | None = None  # drawn already (by a worker), by name
    detection: list[dict[str, object]] = field(default_factory=list)  # the doctor's rows on its
    # buggy and fixed modules (harness.validation.detection_rows)

    @property
    def primary(self) -> Measurement:
        """The first device's float32 cell (or its first cell): the one tabulated in full."""
        full = [m for m in self.cells if m.dtype in FULL_PRECISION]
        return (full or self.cells)[0]

    def overall(self, device: str) -> Verdict:
        return combine({m.dtype: m.verdict for m in self.cells if m.device == device})
