"""What the forward does that a probe may show to be a fault, and the record alone cannot judge:
a finite mask fill (large logits outgrow it; float16 cannot hold it), K/V heads tiled, a dropout
that drops in the recorded call (which runs in eval mode). Each is only where to look; whether
the module suffers it is the probe's to say (``causes.LOCATED``), or, for a dropout, any
comparison's."""

from __future__ import annotations

import math

import torch

from harness.doctor.reading.masks import Fill
from harness.doctor.reading.ops import DROPOUT, LAYOUT, MULTIPLY, SAME, SDPA, TILES
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


OUTGROW = 4.0  # scores spread this many times a fill's size outgrow it in many rows


def outgrown_at(fill: Fill) -> float | None:
    """The activation scale at which the scores outgrow a finite fill that float16 can hold
    (logits any dtype reaches): where their spread is ``OUTGROW`` times the fill's size, the
    scores growing with the square of the activations. None for a fill past float16's range
    (``-1e9``: no logits reach it), -inf, or scores whose spread was not read."""
    value = fill.value if fill.value is not None else fill.added
    if value is None or not -HALF_MAX <= value < 0 or not fill.spread:
        return None
    return math.sqrt(OUTGROW * -value / fill.spread)


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


TURNS = {"cos", "sin", "polar"}  # what makes rotary's tables out of its angles
SPREADS = {"cat", "stack", "repeat", "repeat_interleave", "expand", "tile"}
PRODUCTS = MULTIPLY | {"matmul", "__matmul__", "outer", "einsum", "bmm"}


def angles_made(found: Record) -> Op | None:
    """Where rotary's angles are made, positions times inverse frequencies (the product that
    a cos, sin or polar takes, through casts and layout): in a low precision, far positions'
    angles lose the digits that tell neighbours apart (rope_low_precision)."""
    for op in found.ops:
        if op.name not in TURNS or not op.tensors:
            continue
        value = op.tensors[-1] if op.name == "polar" else op.tensors[0]  # polar(abs, angle)
        for _ in range(8):
            step = found.producer(value)
            if step is None:
                break
            if step.name in PRODUCTS and step.line:
                return step
            if step.name not in SAME | LAYOUT | SPREADS or not step.tensors:
                break
            value = step.tensors[0]
    return None


MAXES = {"max", "amax", "logsumexp"}  # what a stable softmax subtracts first


def naive_softmax(found: Record) -> Op | None:
    """A softmax written out as exp(s) / sum(exp(s)) with no row maximum subtracted from s
    first: large scores overflow exp to inf, and inf / inf is NaN (naive_exp_softmax)."""
    for op in found.ops:
        if op.name not in {"div", "__truediv__", "true_divide", "divide"} or len(op.tensors) < 2:
            continue
        top, bottom = (found.producer(v) for v in op.tensors[:2])
        if top is None or bottom is None or top.name != "exp" or bottom.name != "sum":
            continue
        shifted = found.producer(top.tensors[0]) if top.tensors else None
        while shifted is not None and shifted.name in SAME:
            shifted = found.producer(shifted.tensors[0]) if shifted.tensors else None
        subtracts_max = (
            shifted is not None
            and shifted.name in {"sub", "__sub__"}
            and any(
                (made := found.producer(v)) is not None and made.name in MAXES
                for v in shifted.tensors[1:]
            )
        )
        if not subtracts_max:
            return op
    return None
