"""One cause, named once: when several probes fail with the same error, the error is the
finding, said once, and where its numbers fit a catalogue trap the trap is named with them.

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

from harness.doctor.findings import FAIL, Finding
from harness.doctor.subject import Config

# The error a failing probe reports: "raises: E: text", "raises on ordinary (B=4 T=8): E: ...",
# "raises under torch.autocast(float16): E: ...".
RAISED = re.compile(r"raises(?: [^:]*)?: ([A-Za-z_.]*(?:Error|Exception)\b.*)$")
NUMBER = re.compile(r"\d+")
SHARED = 2  # failures with one error that make it a cause of its own


@dataclass(frozen=True)
class Cause:
    """One error several probes fail with, and the trap it fits (None: none fits)."""

    error: str  # the first probe's error, numbers and all
    probes: tuple[str, ...]
    trap: str | None = None
    fit: str = ""  # what in the error's numbers names the trap

    def line(self) -> str:
        named = f": {self.fit}: {self.trap}" if self.trap else ""
        return f"{len(self.probes)} probes raise {self.error}{named}"


def raised(finding: Finding) -> str | None:
    """The error a failing finding reports, or None when it failed otherwise."""
    if finding.status != FAIL:
        return None
    found = RAISED.search(finding.message)
    return found[1] if found else None


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


def explain(findings: list[Finding], config: Config) -> list[Cause]:
    """The errors that at least ``SHARED`` failing probes share, each named where it fits."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for finding in findings:
        error = raised(finding)
        if error is not None:
            groups.setdefault(NUMBER.sub("<n>", error), []).append((finding.probe, error))
    causes = []
    for members in groups.values():
        if len(members) < SHARED:
            continue
        probes, errors = zip(*members, strict=True)
        fits = ((name, sign(e, config)) for name, sign in SIGNATURES for e in errors)
        trap, fit = next(((name, words) for name, words in fits if words), (None, ""))
        causes.append(Cause(errors[0], tuple(probes), trap, fit))
    return causes
