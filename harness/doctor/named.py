"""The trap the failing probes name, and the failure that leads: the one that names the cause,
printed before the symptoms it shares with other traps. Probes carry the traps their evidence
names as values (``Finding.traps``); nothing here reads their words."""

from __future__ import annotations

from harness.doctor.findings import FAIL, Finding

IDENTIFIES = "agrees with SDPA"  # matches the layer against the catalogue's own bug forms
# Probes whose failure, where it names no trap, is a symptom many traps share (weight on a
# masked key: a window one key too wide, padding applied to the queries, a dropped mask): the
# next failure says which.
SYMPTOMS = ("attention weights",)


def named_trap(findings: list[Finding]) -> str:
    """The catalogue trap a failing comparison with SDPA names (it tells causes apart: a
    softmax over the wrong dim, softcapping after the mask, which the causal leak they cause
    does not), else the one the first other failing finding names (a window of w + 1 keys,
    which SDPA's comparison fails without a name; a symptom's unnamed failure, weight on a
    masked key, passed over), or "" (none fails, or the first names none: a later probe's name
    may be a consequence, not the cause). Traps a finding cannot tell apart are all given
    ("mask_bool or sdpa_mask_inverted")."""
    sdpa, others = _candidates(findings)
    return next((" or ".join(f.traps) for f in sdpa + others[:1] if f.traps), "")


def _candidates(findings: list[Finding]) -> tuple[list[Finding], list[Finding]]:
    """The failures that may name the cause: SDPA's comparison, then the others but bare
    symptoms, in order."""
    failing = [f for f in findings if f.status == FAIL]
    sdpa = [f for f in failing if f.probe == IDENTIFIES]
    others = [f for f in failing if f.probe != IDENTIFIES and not _bare_symptom(f)]
    return sdpa, others


def _bare_symptom(finding: Finding) -> bool:
    """A symptom's failure (``SYMPTOMS``) that names no trap."""
    return finding.probe in SYMPTOMS and not finding.traps


def leading(findings: list[Finding]) -> str | None:
    """The failing probe whose evidence names the trap ``named_trap`` gives: printed first,
    before failures that are its symptoms (None: no failure names one)."""
    sdpa, others = _candidates(findings)
    return next((f.probe for f in sdpa + others if f.traps), None)
