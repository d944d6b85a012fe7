"""Which heatmap shows a trap, chosen without drawing (no matplotlib here).

A trap's heatmap is drawn from the cell where it bites (its first measurement whose verdict is
not BENIGN, the primary one first; else the primary one), on the inputs that cell was judged
on (a CONDITIONAL trap's trigger shape, a NUMERIC trap's edge inputs). It shows the attention
weights, fixed.py beside buggy.py, unless they are the same and only the outputs differ (the bug
is in how the output is assembled): then the outputs and their difference. Of the batch rows
(and heads) it shows the one where buggy.py differs most from fixed.py, a NaN counting as most.
Where fixed.py and buggy.py look the same in both, there is no heatmap: it would show nothing;
nor where they differ by less than a tenth of the colour scale (too faint to see at a glance), nor
for a BENIGN trap, whose two maps are both healthy: drawn side by side, a student would read the
difference as a fault.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import Tensor

from harness.catalogue.judge import Measurement
from harness.catalogue.verdicts import Verdict
from harness.drawn import DECIMALS, rounded
from harness.learning import LEARNS, Learning
from harness.report.results import TrapResult

BITES = (Verdict.SILENT, Verdict.LOUD, Verdict.CONDITIONAL, Verdict.NUMERIC)
SAME = 10.0**-DECIMALS  # arrays this close, as drawn, look the same
VISIBLE = 0.1  # a difference below this share of the colour scale is too faint to see
WEIGHTS = "attention weights"
OUTPUT = "output"


@dataclass(frozen=True)
class Choice:
    """What a trap's heatmap shows: one cell, weights or output, one batch row and head."""

    cell: Measurement
    kind: str  # WEIGHTS or OUTPUT
    index: tuple[int, ...]  # (batch,) or (batch, head): the leading indices of the map drawn
    same: bool  # fixed.py and buggy.py look the same in what is drawn


def bitten_cell(cells: list[Measurement], primary: Measurement) -> Measurement:
    """The cell where the trap bites: ``primary`` if it does, else the first that does."""
    return next((m for m in [primary, *cells] if m.verdict in BITES), primary)


def as_array(tensor: Tensor | None) -> np.ndarray | None:
    """A tensor as drawn: float64 numpy, rounded (``harness.drawn.rounded``)."""
    return None if tensor is None else rounded(tensor.detach().cpu().double().numpy())


def divergence(fix: np.ndarray, bug: np.ndarray) -> tuple[int, float]:
    """How far ``bug`` is from ``fix``: (cells non-finite in one only, max finite difference)."""
    both = np.isfinite(fix) & np.isfinite(bug)
    alike = (np.isnan(fix) & np.isnan(bug)) | (np.isinf(fix) & (fix == bug))
    broken = int((~both & ~alike).sum())
    return broken, float(np.abs(fix - bug)[both].max(initial=0.0))


def same(fix: np.ndarray | None, bug: np.ndarray | None) -> bool:
    """Both there, of one shape, and within ``SAME`` of each other everywhere (NaN alike)."""
    if fix is None or bug is None or fix.shape != bug.shape:
        return False
    broken, largest = divergence(fix, bug)
    return broken == 0 and largest <= SAME


def worst_index(fix: np.ndarray | None, bug: np.ndarray | None) -> tuple[int, ...]:
    """The leading index (all but the last two axes) where ``bug`` differs most from ``fix``.

    Non-finite cells in one and not the other count before any finite difference; ties go to
    the first. All zeros when there is nothing to compare.
    """
    shown = fix if fix is not None else bug
    if shown is None:
        return ()
    leading = shown.shape[:-2]
    if fix is None or bug is None or fix.shape != bug.shape:
        return (0,) * len(leading)
    scores = {i: divergence(fix[i], bug[i]) for i in np.ndindex(*leading)}
    return max(scores, key=lambda i: (scores[i], [-k for k in i]))


def choose(r: TrapResult) -> Choice | None:
    """The cell, kind and map to draw for ``r``; None when neither module gives anything.

    The weights, unless buggy.py's are missing or the same as fixed.py's while the outputs
    differ: then the outputs. A bug that raises is drawn beside fixed.py's weights (else output).
    """
    m = bitten_cell(r.cells, r.primary)
    w_fix, w_bug = as_array(m.weights.get("fix")), as_array(m.weights.get("bug"))
    o_fix, o_bug = as_array(m.outputs.get("fix")), as_array(m.outputs.get("bug"))
    weights_differ = w_fix is not None and w_bug is not None and not same(w_fix, w_bug)
    outputs_differ = o_fix is not None and o_bug is not None and not same(o_fix, o_bug)
    if w_fix is not None and (m.raised or weights_differ or not outputs_differ):
        return Choice(m, WEIGHTS, worst_index(w_fix, w_bug), same(w_fix, w_bug))
    if o_fix is not None:
        return Choice(m, OUTPUT, worst_index(o_fix, o_bug), same(o_fix, o_bug))
    if w_bug is not None:
        return Choice(m, WEIGHTS, worst_index(w_fix, w_bug), False)
    return None


def curves_differ(learning: Learning) -> bool:
    """Whether a picture of the two training curves shows anything: buggy.py trained, and
    learned otherwise than fixed.py (a bug that learns normally runs along fixed.py's curve)."""
    return learning.bug.trained and learning.diagnosis.kind != LEARNS


def faintness(choice: Choice) -> float:
    """The largest |buggy - fixed| of the map drawn, as a share of its colour scale (weights:
    0 to 1; outputs: the largest |value|); 1 where one is missing, of another shape or not
    finite where the other is."""
    source = choice.cell.weights if choice.kind == WEIGHTS else choice.cell.outputs
    fix, bug = (as_array(source.get(k)) for k in ("fix", "bug"))
    if fix is None or bug is None or fix.shape != bug.shape:
        return 1.0
    fix, bug = fix[choice.index], bug[choice.index]
    broken, largest = divergence(fix, bug)
    if broken:
        return 1.0
    finite = np.abs(np.concatenate([fix[np.isfinite(fix)], bug[np.isfinite(bug)]]))
    scale = 1.0 if choice.kind == WEIGHTS else float(finite.max(initial=SAME))
    return largest / max(scale, SAME)


def heatmap_absent(r: TrapResult) -> str | None:
    """Why ``r`` has no heatmap (``choose``), in a clause; None when it has one."""
    choice = choose(r)
    if choice is None:
        return "neither module returns attention weights or an output"
    if choice.same:
        return (
            f"fixed.py and buggy.py give the same attention weights and outputs to {DECIMALS} "
            "decimals, so a heatmap of them would show nothing"
        )
    if r.overall(r.primary.device) is Verdict.BENIGN:
        return (
            "the claimed trap does not exist, and two healthy maps side by side would read as "
            "a fault"
        )
    if (share := faintness(choice)) < VISIBLE:
        return (
            f"buggy.py's {choice.kind} differ from fixed.py's by at most {share:.0%} of the "
            "colour scale, too faint to see; the numbers above say how much"
        )
    return None
