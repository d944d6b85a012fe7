"""The trap a failing probe's evidence names, as the probes write it ("(causal_leak: ...",
": double_scale"), and the failure that leads: the one that names the cause, printed before the
symptoms it shares with other traps."""

from __future__ import annotations

import re

from harness.doctor.findings import FAIL, KNOWN_CAUSES, Finding

# A trap named in a failure's evidence, as the probes name one: "(causal_leak: ...",
# "(rope_cache_offset)", or after a colon, last or before its gloss ("...: double_scale",
# ": softcap_after_mask (cap the scores, then mask them)", ": mask_bool or ..."); never a
# function's argument ("1/sqrt(d_k)").
TRAP_ID = r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+"  # a catalogue trap's id: mask_bool, rope_on_value
NAMED = re.compile(rf"(?<![A-Za-z0-9_])\(({TRAP_ID})[:)]|: ({TRAP_ID})(?:$| \(| or |, )")
LISTED = re.compile(rf"(?:^|\), )({TRAP_ID}) \(")  # each cause after KNOWN_CAUSES
OR_NAMED = re.compile(rf" or ({TRAP_ID})\b")  # the second of two a finding cannot tell apart


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
    may be a consequence, not the cause). Two a finding cannot tell apart
    are both given ("mask_bool or sdpa_mask_inverted")."""
    sdpa, others = _candidates(findings)
    ordered = sdpa + others[:1]
    for finding in ordered:
        if KNOWN_CAUSES in finding.message:  # several, none decided: each is named
            listed = LISTED.findall(finding.message.split(KNOWN_CAUSES, 1)[1])
            if listed:
                return " or ".join(listed)
        found = NAMED.search(finding.message)
        if found:
            name = found[1] or found[2]
            other = OR_NAMED.match(finding.message, found.end(2 if found[2] else 1))
            return f"{name} or {other[1]}" if other else name
    return ""


def _candidates(findings: list[Finding]) -> tuple[list[Finding], list[Finding]]:
    """The failures that may name the cause: SDPA's comparison, then the others but bare
    symptoms, in order."""
    failing = [f for f in findings if f.status == FAIL]
    sdpa = [f for f in failing if f.probe == IDENTIFIES]
    others = [f for f in failing if f.probe != IDENTIFIES and not _bare_symptom(f)]
    return sdpa, others


def _bare_symptom(finding: Finding) -> bool:
    """A symptom's failure (``SYMPTOMS``) that names no trap."""
    return finding.probe in SYMPTOMS and not NAMED.search(finding.message)


def leading(findings: list[Finding]) -> str | None:
    """The failing probe whose evidence names the trap ``named_trap`` gives: printed first,
    before failures that are its symptoms (None: no failure names one)."""
    sdpa, others = _candidates(findings)
    for finding in sdpa + others:
        if named_trap([finding]):
            return finding.probe
    return None
