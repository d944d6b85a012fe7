"""Positions: a relative scheme (rotary, ALiBi) ignores a shift of every position, also in
bfloat16 far from 0; any positional module tells two swapped tokens apart; left padding, with
positions counted from the mask, leaves the real tokens' outputs as they were.

The scheme is declared (``--positions``) or detected (``harness.doctor.subject.position_scheme``),
and each finding says which. A shift is judged against what position does to the module: moving
half of the tokens one position further. A module whose rotary tables are float32 (as most are)
is off by about position x 2^-24 radians after a shift, far below that; rotary applied to values,
or absolute positions, move outputs by as much as moving the tokens does.
"""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import torch
from torch import Tensor

from harness import metrics
from harness.doctor.calling import TABLE_NAMES
from harness.doctor.config import float32_rounding
from harness.doctor.findings import Outcome, failed, passed, skipped, warned
from harness.doctor.probes.registry import probe
from harness.doctor.subject import Subject
from harness.runner import describe

OFFSETS = (4096, 100_000)  # position shifts probed
SHIFT_SHARE = 0.1  # a shift may move outputs by at most this share of what moving tokens does
PAD = 3  # padding tokens put on the left


def _positions(batch: int, seq_len: int, offset: int = 0) -> Tensor:
    return offset + torch.arange(seq_len).expand(batch, seq_len)  # (B, T)


def _outputs(subject: Subject, dtype: torch.dtype, x: Tensor, keep: Tensor | None,
             positions: list[Tensor]) -> list[Tensor]:  # fmt: skip
    """The module's output (float64) for each set of positions, in ``dtype``."""
    module = subject.copy(dtype)
    with torch.no_grad():
        return [subject.call(module, x.to(dtype), keep, p)[0].double() for p in positions]


def _autocast_outputs(subject: Subject, dtype: torch.dtype, x: Tensor, keep: Tensor | None,
                      positions: list[Tensor]) -> list[Tensor]:  # fmt: skip
    """The float32 module's output (float64) for each set of positions under autocast in
    ``dtype``: its activations in ``dtype``, its buffers (an ``inv_freq``) as they are."""
    module = subject.copy(torch.float32)
    with torch.no_grad(), torch.autocast(device_type=subject.device.type, dtype=dtype):
        return [subject.call(module, x.float(), keep, p)[0].double() for p in positions]


def _largest(diff: Tensor) -> float:
    return diff.abs().nan_to_num(math.inf).max().item()


@probe("position shift", compares=True)
def probe_shift(subject: Subject) -> Outcome:
    """A relative scheme: shifting every position by 4096 or 100,000 leaves the output as it is
    (against moving half of the tokens one position further), in float64 and bfloat16."""
    if subject.position_scheme != "relative":
        return skipped(f"not a relative position scheme ({subject.position_source})")
    if not subject.plan.takes_positions:
        return skipped("forward takes no positions to shift")
    cfg = subject.config
    batch, seq_len = cfg.batch, cfg.seq_len
    offsets = _offsets(subject.context, seq_len)
    if not offsets:
        return skipped(f"its context ({subject.context}) leaves no room to shift positions")
    x = subject.x(batch, seq_len, 31)
    keep = subject.ordinary_keep(batch, seq_len)
    base = _positions(batch, seq_len)
    moved = base + (torch.arange(seq_len) >= seq_len // 2)  # half the tokens one further on
    shifted = [_positions(batch, seq_len, offset) for offset in offsets]
    out, out_moved = _outputs(subject, subject.dtype, x, keep, [base, moved])
    try:
        outs = _outputs(subject, subject.dtype, x, keep, shifted)
    except Exception as exc:  # position tables sized for less than it declares
        return skipped(f"positions from {offsets[0]:,} on raise {describe(exc)}: not probed")
    scale = _largest(out_moved - out)
    rounding = float32_rounding(_largest(out))
    if not scale > rounding:
        return skipped(
            "moving half of the positions one on changes nothing: it ignores the positions "
            "passed (see token order)"
        )
    for offset, out_shifted in zip(offsets, outs, strict=True):
        change = _largest(out_shifted - out)
        if not change <= SHIFT_SHARE * scale:
            said = (
                f"shifting every position by {offset:,} moves the output by {change:.3g}, "
                f"against {scale:.3g} for moving half of the tokens one position on"
            )
            if _relative_with_pairs(subject, x, keep, [base, moved, shifted[0]]):
                return failed(
                    f"{said}, and with (cos, sin) tables laid out in pairs (2i, 2i + 1) instead "
                    "of halves (i, i + d/2) a shift changes nothing: it pairs dimensions the "
                    "other way than the tables its caller builds (rope_pairing_mismatch)",
                    "rope_pairing_mismatch",
                )
            if not _values_move(subject, keep, [base, shifted[0]], SHIFT_SHARE * scale):
                return failed(
                    f"{said}, while with every token the same (each output then the one value, "
                    "whatever the weights) a shift changes nothing: the scores carry absolute "
                    "positions, not the values: q and k rotated differently "
                    "(rope_pairing_mismatch: one in pairs (2i, 2i + 1), the other in halves "
                    "(i, i + d/2)), or angles that lose precision far from 0 "
                    "(rope_low_precision) "
                    f"[{subject.position_source}]",
                    "rope_pairing_mismatch",
                    *(("rope_low_precision",) if subject.reading.angles_half else ()),
                )
            reading = subject.reading
            if reading.rotary and not any(n.trap == "rope_on_value" for n in reading.named):
                return failed(  # the forward shows q and k rotated, and v not
                    f"{said}, also with every token the same, while its forward rotates q and "
                    f"k and not the values (at {reading.rotary}): something the rotation does "
                    "not reach enters the scores (a key or bias added unrotated, as a learned "
                    "null key or memory is, or an absolute embedding) "
                    f"[{subject.position_source}]"
                )
            return failed(
                f"{said}, also with every token the same: the values carry absolute positions "
                "(rope_on_value: rotary applied to V, or an absolute embedding) "
                f"[{subject.position_source}]",
                "rope_on_value",
            )
    low = _low_precision(subject, x, keep, base, shifted, offsets)
    if low is not None:
        return low
    return passed(
        f"shifts of {', '.join(f'{o:,}' for o in offsets)} move the output by at most "
        f"{SHIFT_SHARE:g} of what moving tokens does, also in bfloat16 "
        f"[{subject.position_source}]"
    )


def _relative_with_pairs(subject: Subject, x: Tensor, keep: Tensor | None,
                        positions: list[Tensor]) -> bool:  # fmt: skip
    """Given (cos, sin) tables laid out in pairs, the module is relative: a shift (the third
    ``positions``) moves it by a small share of what moving tokens (the second) does."""
    if not any(n in TABLE_NAMES for n in subject.plan.positions):
        return False
    paired = copy.copy(subject)
    paired.plan = replace(subject.plan, table_layout="pairs")
    try:
        out, moved, shifted = _outputs(paired, subject.dtype, x, keep, positions)
    except Exception:
        return False
    scale = _largest(moved - out)
    return (
        scale > float32_rounding(_largest(out)) and _largest(shifted - out) <= SHIFT_SHARE * scale
    )


def _values_move(subject: Subject, keep: Tensor | None, positions: list[Tensor],
                 limit: float) -> bool:  # fmt: skip
    """With one token repeated at every position, a shift (the second ``positions``) moves the
    output by more than ``limit``. Every value is then the same vector, so the output is that
    value whatever the attention weights are, unless the values themselves carry position."""
    batch, seq_len = positions[0].shape
    same = subject.x(batch, 1, 32).expand(batch, seq_len, -1).contiguous()  # (B, T, d)
    try:
        out, shifted = _outputs(subject, subject.dtype, same, keep, positions)
    except Exception:
        return True  # not measurable: the general naming stands
    return _largest(shifted - out) > limit


def _offsets(context: int | None, seq_len: int) -> list[int]:
    """OFFSETS within the module's declared context (its last position is context - 1)."""
    if context is None:
        return list(OFFSETS)
    inside = [o for o in OFFSETS if o + seq_len <= context]
    last = context - seq_len
    return inside if inside else ([last] if last > seq_len else [])


def _low_precision(subject: Subject, x: Tensor, keep: Tensor | None, base: Tensor,
                   shifted: list[Tensor], offsets: list[int]) -> Outcome | None:  # fmt: skip
    """Under autocast in bfloat16, the shifted output stays within the 2x rule of the unshifted
    one's error (both against float64 at positions 0..T-1); a failure, or None when it does.

    Autocast, not a bfloat16 copy: angles computed in the activations' dtype are the trap, while
    a copy made with ``.to(torch.bfloat16)`` rounds every rotary ``inv_freq`` buffer as well,
    transformers' own included (transformers #25681), and its outputs at random weights move by
    about the 2x rule's own margin, so a verdict there would follow the seed."""
    (exact,) = _outputs(subject, torch.float64, x, keep, [base])
    try:
        low, *lows = _autocast_outputs(subject, torch.bfloat16, x, keep, [base, *shifted])
    except Exception:  # a module that does not run in bfloat16 is the robustness probe's
        return None
    floor = metrics.error(low, exact)
    tol = metrics.atol(exact.cpu(), torch.bfloat16)
    limit = metrics.threshold(floor, tol, metrics.OUTPUT_FACTOR)
    for offset, out in zip(offsets, lows, strict=True):
        error = metrics.error(out, exact)
        if not error.max_abs <= limit:
            return failed(
                f"under autocast(bfloat16), shifting every position by {offset:,} gives error "
                f"{error.max_abs:.3g} against {limit:.3g} (2x its error at positions 0..T-1, plus "
                "atol): positions or "
                "their angles computed in bfloat16 (rope_low_precision)",
                "rope_low_precision",
            )
    return None


# the pairs of tokens swapped: the first two, then, where those two look alike to a rotation
# (EVA's class token is not turned, and its first patch's angles are all 0), the next two
SWAPS = ((0, 1), (1, 2))


@probe("token order", compares=True)
def probe_order(subject: Subject) -> Outcome:
    """A module with positions tells two swapped tokens apart: later outputs change."""
    found = subject.positions_found
    if found.scheme == "none" and found.firm:
        return skipped(f"no positions ({found.source})")
    cfg = subject.config
    batch, seq_len = cfg.batch, cfg.seq_len
    x = subject.x(batch, seq_len, 33)
    keep = subject.ordinary_keep(batch, seq_len)
    pairs = [pair for pair in SWAPS if pair[1] + 1 < seq_len]
    if not pairs:
        return skipped(f"{seq_len} tokens: no output comes after two swapped ones")
    module = subject.copy()
    with torch.no_grad():
        out = subject.call(module, x, keep)[0].double()
    rounding, changes = float32_rounding(_largest(out)), []
    for first, second in pairs:
        order = torch.arange(seq_len)
        order[first], order[second] = second, first
        with torch.no_grad():
            swapped = subject.call(module, x[:, order], keep)[0].double()
        if not (torch.isfinite(out).all() and torch.isfinite(swapped).all()):
            return skipped("its output is not finite here (see the other probes)")
        changes.append(_largest((swapped - out)[:, second + 1 :]))  # after the swapped two
        if changes[-1] > rounding:
            return passed(
                f"swapping tokens {first} and {second} moves later outputs by {changes[-1]:.3g}"
            )
    tried = ", or ".join(f"{first} and {second}" for first, second in pairs)
    verdict = failed if found.firm else warned
    return verdict(
        f"swapping tokens {tried} moves later outputs by {max(changes):.3g} (rounding: "
        f"{rounding:.2g}): position-blind [{found.source}]; if it is meant to be rotary, "
        "that is rope_wrong_axis (rotation along the wrong axis; --positions relative "
        "makes this a failure, --positions none silences it)",
        *(("rope_wrong_axis",) if found.scheme == "relative" else ()),
    )


@probe("left padding", compares=True)
def probe_left_padding(subject: Subject) -> Outcome:
    """Left padding leaves real tokens' outputs as they are, with the module's own positions."""
    if subject.position_scheme == "none":
        return skipped(f"no positions ({subject.position_source}): the padding probe covers it")
    if not subject.takes_mask:
        return skipped("takes no mask: padding cannot be declared")
    if subject.fixed_length is not None:
        return skipped(f"it takes {subject.fixed_length} tokens only ({subject.length_source}): "
                       "no padding can go before them")  # fmt: skip
    cfg = subject.config
    batch, seq_len = cfg.batch, cfg.seq_len
    x = subject.x(batch, seq_len, 35)
    pad = subject.x(batch, PAD, 36)
    padded = torch.cat([pad, x], dim=1)  # (B, PAD + T, d)
    total = PAD + seq_len
    causal = torch.ones(total, total, dtype=torch.bool).tril()
    real = torch.arange(total) >= PAD  # (PAD + T,)
    keep = (causal & real[None, :] & real[:, None]).expand(batch, total, total).clone()
    plain = causal[:seq_len, :seq_len].expand(batch, seq_len, seq_len).clone()
    from_mask = (real.long().cumsum(0) - 1).clamp(min=0).expand(batch, total)  # (B, PAD + T)
    # positions the caller must pass are counted from the mask, as a caller does; a default is
    # the module's own and is probed as it is
    required = subject.plan.takes_positions and not subject.plan.optional_positions
    module = subject.copy()
    with torch.no_grad():
        out = subject.call(module, x, plain, defaults=True)[0].double()
        given = from_mask if required else None
        out_padded = subject.call(module, padded, keep, given, defaults=True)[0].double()[:, PAD:]
        explicit = None
        if subject.plan.optional_positions:
            explicit = subject.call(module, padded, keep, from_mask)[0].double()[:, PAD:]
    change = _largest(out_padded - out)
    rounding = float32_rounding(_largest(out))
    if change > rounding:
        cure = ""
        if explicit is not None and _largest(explicit - out) <= rounding:
            cure = "; with positions counted from the mask passed explicitly they agree"
        # a rotation whose table is laid out for the other pairing turns by absolute angles
        other = [n for n in subject.reading.named if n.trap == "rope_pairing_mismatch"]
        unturned = f"; or {other[0].why}: no rotation (rope_pairing_mismatch)" if other else ""
        return failed(
            f"{PAD} padding tokens on the left move the real tokens' outputs by {change:.3g}: "
            f"their positions count the padding (left_pad_positions){cure}, or the padding "
            f"mask is not applied (see padding no-leak){unturned}",
            "left_pad_positions",
            *(("rope_pairing_mismatch",) if other else ()),
        )
    return passed(f"{PAD} padding tokens on the left change real outputs by {change:.3g}")


@probe("packed documents", compares=True)
def probe_packed(subject: Subject) -> Outcome:
    """Declared packing (--packed): where positions restart at 0 a new document begins, and its
    outputs do not depend on the document before it."""
    if not subject.config.packed:
        return skipped("packing not declared (--packed)")
    if not subject.plan.takes_positions:
        return skipped("forward takes no positions to mark where documents start")
    cfg = subject.config
    batch, seq_len = cfg.batch, cfg.seq_len
    start = seq_len // 2
    arange = torch.arange(seq_len)
    positions = torch.where(arange >= start, arange - start, arange).expand(batch, seq_len)
    x = subject.x(batch, seq_len, 37)
    other = torch.cat([subject.x(batch, start, 38), x[:, start:]], dim=1)  # a new first document
    keep = subject.ordinary_keep(batch, seq_len)
    module = subject.copy()
    with torch.no_grad():
        out = subject.call(module, x, keep, positions)[0].double()
        out_other = subject.call(module, other, keep, positions)[0].double()
    change = _largest((out_other - out)[:, start:])
    rounding = float32_rounding(_largest(out))
    if change > rounding:
        return failed(
            f"the second packed document's outputs move by {change:.3g} when the first "
            "document changes: tokens attend across documents (packing_cross_document)",
            "packing_cross_document",
        )
    return passed(f"the second packed document ignores the first (change {change:.3g})")
