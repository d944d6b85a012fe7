"""One cause, named once, first: a trap the recorded forward shows (``harness.doctor.reading``),
at its line, above the failures it explains; and when several probes fail with the same error,
the error, said once, and where its numbers fit a catalogue trap the trap is named with them.

A module whose every call raises fails every probe that calls it; twelve identical lines hide
the one thing to fix. ``explain`` groups the failures whose error is the same once its numbers
are masked (the probes call with different shapes), and fits each group's error against the
signatures of the traps that raise: a 4-D mask against bmm's 3-D scores (``mask_rank``), keys
transposed on the batch axis (``transpose``). A signature names a trap only when its numbers
say so; otherwise the error is reported as it is, once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from harness.doctor.config import Config
from harness.doctor.findings import FAIL, NUMBER, Finding, raised
from harness.doctor.reading.known import Named, Reading

SHARED = 2  # failures with one error that make it a cause of its own


# The failing probes a trap read from the forward explains (None: any failure). A scale only
# moves the outputs (SDPA's reference) and, after the softmax, the weights' sums.
SCALE_PROBES = frozenset({"agrees with SDPA", "attention weights", "read from the forward"})
# A padding mask laid along the wrong axis shows where the mask is read, and in NaN or leaks.
MASK_PROBES = frozenset({
    "padding no-leak", "causal no-leak", "all-masked rows", "left padding", "packed documents",
    "agrees with SDPA", "cached decoding", "cache reuse", "float16 robustness",
    "bfloat16 robustness", "sliding window", "batch independence",
})  # fmt: skip
# Rotations that disagree make the scores depend on where the tokens are, not how far apart;
# against a declared pairing the reading fails them by itself.
POSITION_PROBES = frozenset({
    "position shift", "token order", "left padding", "packed documents", "cached decoding",
    "cache reuse", "agrees with SDPA", "read from the forward",
})  # fmt: skip
EXPLAINS: dict[str, frozenset[str] | None] = {
    "softmax_dim": None,
    "mask_bool": None,
    "missing_scale": SCALE_PROBES,
    "scale_d_model": SCALE_PROBES,
    "double_scale": SCALE_PROBES,
    "wrong_scale": SCALE_PROBES,
    "scale_after_softmax": SCALE_PROBES,
    "causal_leak": frozenset({"causal no-leak", "agrees with SDPA", "cached decoding"}),
    "sdpa_float_mask": None,
    "mask_rank": None,
    "head_merge_no_transpose": None,
    "head_split_view": None,
    "rope_on_value": None,
    "rope_pairing_mismatch": POSITION_PROBES,
    "padding_on_queries": MASK_PROBES,
    "sdpa_mask_inverted": None,
    "dropout_in_eval": None,  # random outputs fail whatever compares them
    "mask_to_additive_nan": None,  # NaN fails whatever reads the outputs
    "transpose": None,  # a forward that raises fails every probe that calls it
}


@dataclass(frozen=True)
class Cause:
    """One cause of failures: a trap the forward shows (``error`` empty: ``fit`` says what was
    read), or an error several probes fail with and the trap it fits (None: none fits).
    ``at``: the source line where it is, when the recorded forward shows it."""

    error: str  # the first probe's error, numbers and all ("" for a trap read from the forward)
    probes: tuple[str, ...]
    trap: str | None = None
    fit: str = ""  # what in the error's numbers, or in the forward, names the trap
    at: str = ""
    also: tuple[str, ...] = ()  # other lines the trap involves (where a factor is made)

    @property
    def read(self) -> bool:
        """Named from what the forward computed, not from an error."""
        return not self.error

    def said(self) -> str:
        where = f" at {self.at}" if self.at else ""
        if self.read:
            return f"{self.trap}{where}: {self.fit}"
        named = f": {self.fit}: {self.trap}" if self.trap else ""
        return f"{len(self.probes)} probes raise {self.error}{where}{named}"


def _mask_rank(error: str, config: Config) -> str | None:
    """A 4-D mask made the scores 4-D, and bmm takes 3-D tensors only."""
    if not re.search(r"must be a 3D tensor|Expected 3D|3-dimensional", error):
        return None
    if config.mask_shape not in ("b1qk", "b11k"):
        return None
    return (
        f"the {config.mask_shape} mask is 4-D, masked_fill broadcasts the 3-D (B, T, T) scores "
        "to 4-D with it, and bmm takes 3-D tensors only: such a mask does not broadcast to "
        "(B, T, T) (give 3-D scores a (B, T, T) mask, or make the scores 4-D)"
    )


def _transpose(error: str, config: Config) -> str | None:
    """bmm's second operand arrives (T, B, d): the keys were transposed on (0, 1)."""
    found = re.search(r"batch2 tensor to be: \[(\d+), (\d+)\] but got: \[(\d+), (\d+)\]", error)
    if not found:
        return None
    batch, _, first, second = (int(n) for n in found.groups())
    if second != batch or first == batch:
        return None
    return (
        f"bmm's second operand has the batch ({batch}) on its second axis and {first} on its "
        f"first ([{first}, {second}] where [{found[1]}, {found[2]}] was expected): the keys "
        "were transposed on (0, 1), batch with sequence, where (1, 2) was meant"
    )


# The traps that show as one error, each with the fit that names it.
SIGNATURES: tuple[tuple[str, Callable[[str, Config], str | None]], ...] = (
    ("mask_rank", _mask_rank),
    ("transpose", _transpose),
)


# Traps that a probe names from what it measures, and the forward only locates: each explains
# the failing probes that name it (a finite fill is a risk; a probe shows whether it bites).
LOCATED = frozenset({
    "fill_too_small", "fill_overflow_half", "qk_overflow_half", "gqa_kv_grouping",
    "sliding_window_off_by_one", "softcap_after_mask", "init_unit_variance",
})  # fmt: skip


def _alone_at(finding: Finding, named: Named) -> bool:
    """``finding`` names ``named``'s trap alone, and where it watched the fault happen (if it
    did) is ``named``'s line."""
    at = finding.at.split(" ", 1)[0]
    return set(finding.traps) == {named.trap} and (not at or named.line.split(" ", 1)[0] == at)


def read_causes(findings: list[Finding], reading: Reading) -> list[Cause]:
    """The traps the forward shows, each with the failing probes it explains (a trap that
    explains no failure is no cause: a fact alone never fails a module)."""
    failing = [f for f in findings if f.status == FAIL]
    scopes = []
    for named in reading.named:
        scope = EXPLAINS.get(named.trap, frozenset())
        if named.trap in LOCATED or named.located:
            scope = frozenset(f.probe for f in failing if named.trap in f.traps
                              and (not named.sole or _alone_at(f, named)))  # fmt: skip
        scopes.append(scope)
    # a failure that names a trap located in the forward is that trap's before any trap's
    # that explains whatever fails (a mask read the wrong way does not make angles imprecise)
    order = sorted(range(len(scopes)), key=lambda i: scopes[i] is None)
    claimed: dict[int, tuple[str, ...]] = {}
    taken: set[str] = set()
    for i in order:
        scope = scopes[i]
        probes = tuple(
            f.probe for f in failing if f.probe not in taken and (scope is None or f.probe in scope)
        )
        if probes:
            claimed[i] = probes
            taken |= set(probes)
    return [
        Cause("", claimed[i], named.trap, named.why, named.line, named.also)
        for i, named in enumerate(reading.named) if i in claimed
    ]  # fmt: skip


def watched_causes(findings: list[Finding], explained: set[str]) -> list[Cause]:
    """The traps a probe watched happen at a line of the user's code and names alone (the
    line that decided where a cache writes its keys), for the failures no read cause
    explains: one cause per trap and line, with the probes that watched it."""
    found: dict[tuple[str, str], Cause] = {}
    for f in findings:
        if f.status != FAIL or f.probe in explained or not (f.at and f.why) or len(f.traps) != 1:
            continue
        key = (f.traps[0], f.at)
        probes = found[key].probes if key in found else ()
        found[key] = Cause("", (*probes, f.probe), f.traps[0], f.why, f.at)
    return list(found.values())


def explain(findings: list[Finding], config: Config, reading: Reading | None = None) -> list[Cause]:
    """The traps the forward shows that explain failures (first), then the traps probes
    watched at a line, then the errors that at least ``SHARED`` other failing probes share,
    each named where it fits."""
    first = read_causes(findings, reading) if reading is not None else []
    first += watched_causes(findings, {p for cause in first for p in cause.probes})
    explained = {p for cause in first for p in cause.probes}
    last = reading.raised if reading is not None else None  # the op that raised, if one did
    groups: dict[str, list[tuple[str, str]]] = {}
    for finding in findings:
        error = raised(finding) if finding.probe not in explained else None
        if error is not None:
            groups.setdefault(NUMBER.sub("<n>", error), []).append((finding.probe, error))
    causes = first
    for members in groups.values():
        if len(members) < SHARED:
            continue
        probes, errors = zip(*members, strict=True)
        fits = ((name, sign(e, config)) for name, sign in SIGNATURES for e in errors)
        trap, fit = next(((name, words) for name, words in fits if words), (None, ""))
        at = last.where if last is not None and last.raised in errors[0] else ""
        causes.append(Cause(errors[0], tuple(probes), trap, fit, at))
    return causes
