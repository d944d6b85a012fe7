"""What the doctor found: one Finding per probe, a Diagnosis per module, and its renderings."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

from harness.doctor.config import Config

if TYPE_CHECKING:
    from harness.doctor.causes import Cause
    from harness.doctor.fixes import Fix
    from harness.doctor.reading.known import Fact

PASS, FAIL, WARN, SKIP = "pass", "fail", "warn", "skip"
# The error a failing probe reports: "raises: E: text", "raises on ordinary (B=4 T=8): E: ...",
# "raises under torch.autocast(float16): E: ...".
RAISED = re.compile(r"raises(?: [^:]*)?: ([A-Za-z_.]*(?:Error|Exception)\b.*)$")
NUMBER = re.compile(r"\d+")
# How a failure lists the causes it cannot tell apart: "Known causes: a (gloss), b (gloss)";
# the model's table then names every one of them ("a or b").
KNOWN_CAUSES = "Known causes: "


@dataclass(frozen=True)
class Said:
    """Evidence and the catalogue traps it names, as values (several: ones it cannot tell
    apart, most likely first). Joined with ``+`` to text or to another ``Said``, the traps
    travel with the words; formatted into an f-string they would not, so join, don't format."""

    text: str
    traps: tuple[str, ...] = ()
    at: str = ""  # the source line a probe watched the fault at, where it did
    why: str = ""  # what it watched there, in a line (printed under the cause)

    def __add__(self, other: Said | str) -> Said:
        if isinstance(other, Said):
            return Said(self.text + other.text, _union(self.traps, other.traps),
                        self.at or other.at, self.why or other.why)  # fmt: skip
        return Said(self.text + other, self.traps, self.at, self.why)

    def __radd__(self, other: str) -> Said:
        return Said(other + self.text, self.traps, self.at, self.why)

    def __bool__(self) -> bool:
        return bool(self.text)

    def __str__(self) -> str:  # the words alone: formatted, the traps stay behind
        return self.text


def _union(first: tuple[str, ...], second: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(first + second))


def named(text: str, *traps: str) -> Said:
    """``text``, which names ``traps``."""
    return Said(text, traps)


def as_said(evidence: Said | str) -> Said:
    return evidence if isinstance(evidence, Said) else Said(evidence)


@dataclass(frozen=True)
class Outcome:
    """What a probe returns: its status, the evidence (or the reason it was skipped) and the
    catalogue traps the evidence names."""

    status: str
    message: str = ""
    traps: tuple[str, ...] = ()
    at: str = ""  # where the probe watched the fault happen ("" where it did not)
    why: str = ""  # what it watched there


def _outcome(status: str, evidence: Said | str, traps: tuple[str, ...]) -> Outcome:
    said = as_said(evidence)
    return Outcome(status, said.text, _union(said.traps, traps), said.at, said.why)


def passed(message: Said | str) -> Outcome:
    """A pass names no cause, whatever its words mention."""
    return Outcome(PASS, as_said(message).text)


def failed(message: Said | str, *traps: str) -> Outcome:
    return _outcome(FAIL, message, traps)


def warned(message: Said | str, *traps: str) -> Outcome:
    return _outcome(WARN, message, traps)


def skipped(message: str) -> Outcome:
    return Outcome(SKIP, message)


def config_json(config: Config) -> dict[str, object]:
    """The config as JSON values: a call adapter by its qualified name."""
    values = asdict(config)
    if config.call is not None:
        call = config.call
        values["call"] = f"{getattr(call, '__module__', '?')}:{getattr(call, '__qualname__', call)}"
    return values


@dataclass(frozen=True)
class Finding:
    """One probe's result: pass, fail, warn or skip, with evidence or the reason, and the
    catalogue traps the evidence names (values, never read back out of the words)."""

    probe: str
    status: str
    message: str = ""
    traps: tuple[str, ...] = ()
    at: str = ""  # the source line the probe watched the fault at, where it did
    why: str = ""  # what it watched there, in a line

    @classmethod
    def of(cls, probe: str, outcome: Outcome) -> Finding:
        return cls(probe, outcome.status, outcome.message, outcome.traps, outcome.at,
                   outcome.why)  # fmt: skip


def findings_table(findings: list[Finding]) -> pd.DataFrame:
    """One row per finding: probe, status, message."""
    return pd.DataFrame([asdict(f) for f in findings], columns=["probe", "status", "message"])


def markdown_header(target: str, healthy: bool, details: str) -> list[str]:
    """The first lines of a diagnosis in markdown: its title and verdict."""
    verdict = "healthy" if healthy else "problems found"
    return [f"# Attention doctor: `{target}`", "", f"Verdict: **{verdict}** ({details})."]


def raised(finding: Finding) -> str | None:
    """The error a failing finding reports, or None when it failed otherwise."""
    if finding.status != FAIL:
        return None
    found = RAISED.search(finding.message)
    return found[1] if found else None


def consequences(findings: list[Finding]) -> list[tuple[str, list[str]]]:
    """What each failing probe under a cause says: the probes that raise one error (once its
    numbers are masked) said once, the others each in its own words."""
    said: dict[str, tuple[str, list[str]]] = {}
    for f in findings:
        error = raised(f)
        key = NUMBER.sub("<n>", error) if error else f.probe
        said.setdefault(key, (f"raises {error}" if error else f.message, []))[1].append(f.probe)
    return list(said.values())


def explained_lines(cause: Cause, by_probe: dict[str, Finding], indent: int) -> list[str]:
    """The failures a cause read from the forward explains, one line each under it (the
    reading's own finding, which says the cause again, as "as above")."""
    shown_above = f"{cause.trap}: {cause.fit} (at {cause.at})"
    lines = []
    for said, probes in consequences([by_probe[p] for p in cause.probes]):
        if said.startswith(shown_above):
            said = "as above" + said.removeprefix(shown_above)
        lines.append(f"{'':<{indent}}- {', '.join(probes)}: {said}".rstrip())
    return lines


@dataclass
class Diagnosis:
    """All findings for one module."""

    target: str
    config: Config
    findings: list[Finding] = field(default_factory=list)
    causes: list[Cause] = field(default_factory=list)  # read traps, shared errors (causes.py)
    facts: list[Fact] = field(default_factory=list)  # what the recorded forward showed
    lead: str | None = None  # the failing probe that names the cause, printed first
    fixes: list[Fix] = field(default_factory=list)  # proven changes to the user's lines
    looks: dict[str, str] = field(default_factory=dict)  # trap -> where to look, unfixed
    head_width: int | None = None  # the width q and k are contracted over, as the forward read

    @property
    def failures(self) -> list[Finding]:
        bad = (FAIL, WARN) if self.config.strict else (FAIL,)
        return [f for f in self.findings if f.status in bad]

    @property
    def healthy(self) -> bool:
        return not self.failures

    @property
    def exit_code(self) -> int:
        return 0 if self.healthy else 1

    def table(self) -> pd.DataFrame:
        return findings_table(self.findings)

    @property
    def problems(self) -> int:
        """Failures, a shared cause counted once."""
        grouped = {probe for cause in self.causes for probe in cause.probes}
        return len([f for f in self.failures if f.probe not in grouped]) + len(self.causes)

    def text(self) -> str:
        """The causes read from the forward first, each at its line with the failures it
        explains under it; then one line per other finding (one for the probes that fail
        with one error); then the facts the doctor went on."""
        read = [c for c in self.causes if c.read]
        under = {probe for cause in read for probe in cause.probes}
        width = max(len(f.probe) for f in self.findings)
        by_probe = {f.probe: f for f in self.findings}
        lines = []
        for cause in read:
            lines.append(f"FAIL  {cause.trap:<{width}}  at {cause.at}".rstrip())
            lines.append(f"{'':<{width + 8}}{cause.fit}")
            lines += explained_lines(cause, by_probe, width + 6)
            lines += self._fix_lines(cause.trap, width + 6)
        grouped = {probe: c for c in self.causes if not c.read for probe in c.probes}
        shown = set()
        first = [f for f in self.findings if f.probe == self.lead and f.probe not in grouped]
        for f in first + [f for f in self.findings if f not in first]:
            cause = grouped.get(f.probe)
            if f.probe in under:
                continue
            if cause is None:
                lines.append(f"{f.status.upper():<4}  {f.probe:<{width}}  {f.message}".rstrip())
            elif cause not in shown:
                shown.add(cause)
                named = ", ".join(cause.probes)
                lines.append(f"FAIL  {'one cause':<{width}}  {cause.said()} ({named})")
                lines += self._fix_lines(cause.trap, width + 6)
        causes = {c.trap for c in self.causes}
        later = [fix for fix in self.fixes if fix.trap not in causes]
        if later:  # found once an earlier fix was in: in the diff, so printed too
            lines.append("with the fixes above in, more was found and proven:")
            lines += [line for fix in later for line in fix.text(" " * (width + 6))]
        if self.facts:
            lines.append("read from one recorded forward:")
            lines += [f"  {fact.text()}" for fact in self.facts]
        verdict = "healthy" if self.healthy else f"{self.problems} problem(s)"
        warned = sum(f.status == WARN for f in self.findings)
        tail = f" ({warned} warning(s))" if warned and self.healthy else ""
        return "\n".join([f"attention doctor: {self.target}", *lines, f"=> {verdict}{tail}"])

    def _fix_lines(self, trap: str | None, indent: int) -> list[str]:
        """The proven fixes of ``trap``, as printed under its cause; where none was proven,
        where to look (when fixes were sought)."""
        fixed = [line for fix in self.fixes if fix.trap == trap for line in fix.text(" " * indent)]
        looked = [f"{' ' * indent}{self.looks[trap]}"] if trap in self.looks else []
        return fixed or looked

    def to_json(self) -> str:
        return json.dumps(
            {
                "target": self.target,
                "healthy": self.healthy,
                "config": config_json(self.config),
                "findings": [asdict(f) for f in self.findings],
                "causes": [asdict(c) for c in self.causes],
                "facts": [asdict(f) for f in self.facts],
                "fixes": [asdict(f) for f in self.fixes],
                "looks": self.looks,
            },
            indent=2,
            default=str,  # a fix's path
        )

    def markdown(self) -> str:
        details = (
            f"mask convention `{self.config.mask}`, causal {self.config.causal}, "
            f"batch {self.config.batch}, seq_len {self.config.seq_len}, "
            f"device {self.config.device}, seed {self.config.seed}"
        )
        lines = [
            *markdown_header(self.target, self.healthy, details),
            "",
            self.table().to_markdown(index=False),
        ]
        return "\n".join(lines) + "\n"
