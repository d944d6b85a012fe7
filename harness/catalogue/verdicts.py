"""The verdict words and how per-dtype verdicts combine into one."""

from __future__ import annotations

from enum import Enum


class Verdict(str, Enum):
    """How a trap shows itself. See DESIGN.md, "Verdicts"."""

    SILENT = "SILENT"  # runs without error and diverges beyond the noise floor
    LOUD = "LOUD"  # raises, so the user finds it at once
    CONDITIONAL = "CONDITIONAL"  # raises on most shapes, runs silently on trigger shapes
    NUMERIC = "NUMERIC"  # fine in float32, breaks only in low precision or on edge inputs
    BENIGN = "BENIGN"  # within the noise floor: the claimed trap does not hold
    INCONCLUSIVE = "INCONCLUSIVE"  # cannot tell: even fixed.py breaks on these inputs here

    def __str__(self) -> str:
        return self.value


# What each verdict means, in the words the report prints (its legend and its scorecard).
MEANING = {
    Verdict.SILENT: "runs without error and gives a wrong result: the dangerous kind",
    Verdict.LOUD: "raises an error, so you find it at once",
    Verdict.CONDITIONAL: "raises on most shapes, runs silently on some (trigger shapes, found by "
    "search)",
    Verdict.NUMERIC: "right in float32, broken (NaN, Inf or an error) only in low precision or "
    "on edge inputs",
    Verdict.BENIGN: "within rounding noise of fixed.py (or only slower): the claimed trap does "
    "not hold",
    Verdict.INCONCLUSIVE: "this dtype cannot tell: even fixed.py overflows on the inputs that "
    "would show it",
}

FULL_PRECISION = ("float32", "float64")


def combine(per_dtype: dict[str, Verdict]) -> Verdict:
    """One verdict for a trap on one device from its verdict in each dtype.

    A trap that is BENIGN in full precision but not in some low-precision dtype is NUMERIC;
    otherwise the full-precision verdict stands (float32 when measured, else the first dtype).
    INCONCLUSIVE dtypes say nothing either way: they count only when every dtype is.
    """
    if not per_dtype:
        raise ValueError("no verdicts to combine")
    decided = {d: v for d, v in per_dtype.items() if v is not Verdict.INCONCLUSIVE}
    if not decided:
        return Verdict.INCONCLUSIVE
    per_dtype = decided
    full = [v for d, v in per_dtype.items() if d in FULL_PRECISION]
    base = full[0] if full else next(iter(per_dtype.values()))
    low = [v for d, v in per_dtype.items() if d not in FULL_PRECISION]
    if full and base is Verdict.BENIGN and any(v is not Verdict.BENIGN for v in low):
        return Verdict.NUMERIC
    return base
