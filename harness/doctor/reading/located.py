"""What the forward does that a probe may show to be a fault, and the record alone cannot judge:
a finite mask fill (large logits outgrow it; float16 cannot hold it), K/V heads tiled, a dropout
that drops in the recorded call (which runs in eval mode). Each is only where to look; whether
the module suffers it is the probe's to say (``causes.LOCATED``), or, for a dropout, any
comparison's."""

from __future__ import annotations

import math

import torch

from harness.doctor.reading.masks import Fill
from harness.doctor.reading.ops import DROPOUT, SDPA, TILES
from harness.doctor.reading.record import Op, Record

HALF_MAX = float(torch.finfo(torch.float16).max)


def finite_fill(fill: Fill) -> list[tuple[str, str]]:
    """The traps a finite fill value risks, each with why: logits that outgrow it
    (``fill_too_small``), and past float16's range, a value float16 cannot hold
    (``fill_overflow_half``)."""
    value = fill.value if fill.value is not None else fill.added  # filled, or added
    if value is None or not math.isfinite(value) or value >= 0:
        return []
    found = [("fill_too_small", f"the mask fills with a finite {value:g}, which large "
              "enough logits outgrow")]  # fmt: skip
    if -value > HALF_MAX:
        found.append(("fill_overflow_half", f"the mask fills with {value:g}, past "
                      f"float16's largest finite value ({HALF_MAX:g})"))  # fmt: skip
    return found


def tilings(found: Record) -> list[Op]:
    """The ops that tile a tensor of three or more axes (``repeat``, ``tile``), or copy one
    along a new axis of a tensor of four or more (``expand``, as ``repeat_kv`` does before it
    folds the copies into the heads): where K/V heads copied for grouped queries are, when a
    probe finds them tiled."""
    return [op for op in found.ops if op.args and op.args[0].shape and _copies(op)]


def _copies(op: Op) -> bool:
    given = op.args[0].shape or ()
    if op.name in TILES:
        return len(given) >= 3
    if op.name != "expand" or len(given) < 4 or not op.shapes:
        return False
    made = op.shapes[0]
    return len(made) == len(given) and any(a == 1 < b for a, b in zip(given, made, strict=True))


def dropout_left_on(found: Record) -> tuple[str, Op] | None:
    """A dropout that drops in the recorded call, which runs in eval mode, and how: a dropout
    op told to train (``F.dropout(x, p)``: its ``training`` is True unless given), or SDPA
    given a ``dropout_p`` (SDPA drops whenever it is given one; 0.0 must be given in eval)."""
    for op in found.ops:
        if op.name in DROPOUT:
            position, flag = DROPOUT[op.name]
            p = op.const(1, "p", 0.5)
            if isinstance(p, int | float) and p > 0 and op.const(position, flag, True) is True:
                return f"{op.name} with p={p:g} and {flag}=True", op
        elif op.name in SDPA:
            p = op.const(4, "dropout_p", 0.0)
            if isinstance(p, int | float) and p > 0:
                return f"SDPA given dropout_p={p:g}, which it applies in any mode", op
    return None
