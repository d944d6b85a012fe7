"""Numbers as a picture draws them: rounded first, so float32 results that differ in the last
bits from CPU to CPU draw the same bytes, and so that what to draw can be chosen (two maps that
look the same) without loading matplotlib."""

from __future__ import annotations

import numpy as np
import pandas as pd

DECIMALS = 3  # heatmap data is rounded to this many decimals before it is drawn
DIGITS = 3  # line plot data is rounded to this many significant digits


def rounded(data: np.ndarray) -> np.ndarray:
    """``data`` as float64 rounded to ``DECIMALS`` decimals; NaN and Inf stay as they are."""
    return np.round(np.asarray(data, dtype=np.float64), DECIMALS)


def significant(values: pd.Series) -> list[float]:
    """``values`` rounded to ``DIGITS`` significant digits (small numbers keep their size)."""
    return [float(f"{v:.{DIGITS}g}") for v in values]  # nan and inf stay as they are
