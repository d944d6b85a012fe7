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
    from harness.doctor.reading.facts import Fact

PASS, FAIL, WARN, SKIP = "pass", "fail", "warn", "skip"
# The error a failing probe reports: "raises: E: text", "raises on ordinary (B=4 T=8): E: ...",
# "raises under torch.autocast(float16): E: ...".
RAISED = re.compile(r"raises(?: [^:]*)?: ([A-Za-z_.]*(?:Error|Exception)\b.*)$")
NUMBER = re.compile(r"\d+")
# How a failure lists the causes it cannot tell apart: "Known causes: a (gloss), b (gloss)";
# the model's table then names every one of them ("a or b").
KNOWN_CAUSES = "Known causes: "


@dataclass(frozen=True)
class Outcome:
    """What a probe returns: its status and the evidence (or the reason it was skipped)."""

    status: str
    message: str = ""


def passed(message: str) -> Outcome:
    return Outcome(PASS, message)


def failed(message: str) -> Outcome:
    return Outcome(FAIL, message)


def warned(message: str) -> Outcome:
    return Outcome(WARN, message)


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
    """One probe's result: pass, fail, warn or skip, with evidence or the reason."""

    probe: str
    status: str
    message: str = ""


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


@dataclass
class Diagnosis:
    """All findings for one module."""

    target: str
    config: Config
    findings: list[Finding] = field(default_factory=list)
    causes: list[Cause] = field(default_factory=list)  # read traps, shared errors (causes.py)
    facts: list[Fact] = field(default_factory=list)  # what the recorded forward showed
    lead: str | None = None  # the failing probe that names the cause, printed first

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
            for said, probes in consequences([by_probe[p] for p in cause.probes]):
                lines.append(f"{'':<{width + 6}}- {', '.join(probes)}: {said}".rstrip())
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
        if self.facts:
            lines.append("read from one recorded forward:")
            lines += [f"  {fact.text()}" for fact in self.facts]
        verdict = "healthy" if self.healthy else f"{self.problems} problem(s)"
        warned = sum(f.status == WARN for f in self.findings)
        tail = f" ({warned} warning(s))" if warned and self.healthy else ""
        return "\n".join([f"attention doctor: {self.target}", *lines, f"=> {verdict}{tail}"])

    def to_json(self) -> str:
        return json.dumps(
            {
                "target": self.target,
                "healthy": self.healthy,
                "config": config_json(self.config),
                "findings": [asdict(f) for f in self.findings],
                "causes": [asdict(c) for c in self.causes],
                "facts": [asdict(f) for f in self.facts],
            },
            indent=2,
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
