"""What the doctor found on a model: one diagnosis per group of attention layers, one finding
per model property, and their renderings (text, JSON, markdown)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import pandas as pd

from harness.doctor.findings import (
    FAIL,
    PASS,
    WARN,
    Diagnosis,
    Finding,
    explained_lines,
    findings_table,
    markdown_header,
)
from harness.doctor.named import named_trap


@dataclass
class LayerGroup:
    """Attention layers of one class and configuration, and the diagnosis of the first."""

    paths: list[str]
    cls: str
    diagnosis: Diagnosis

    @property
    def label(self) -> str:
        more = len(self.paths) - 1
        return self.paths[0] + (f" (+{more} like it)" if more else "")

    def counts(self) -> str:
        statuses = [f.status for f in self.diagnosis.findings]
        return f"{statuses.count(PASS)} pass, {statuses.count(FAIL)} fail"


def first_trap(diagnosis: Diagnosis) -> str:
    """The trap a layer's diagnosis names first: the cause read from its forward or fitted to
    the error its probes share, else the one its failures' evidence names."""
    named = next((c.trap for c in diagnosis.causes if c.trap), None)
    return named or named_trap(diagnosis.findings)


@dataclass
class ModelDiagnosis:
    """All findings for one model."""

    target: str
    model_class: str
    strict: bool = False
    groups: list[LayerGroup] = field(default_factory=list)
    properties: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # how the model was read (dtype, causal)

    @property
    def failures(self) -> list[Finding]:
        bad = (FAIL, WARN) if self.strict else (FAIL,)
        return [f for f in self.properties if f.status in bad]

    @property
    def healthy(self) -> bool:
        return not self.failures and all(g.diagnosis.healthy for g in self.groups)

    @property
    def exit_code(self) -> int:
        return 0 if self.healthy else 1

    def layer_table(self) -> pd.DataFrame:
        rows = [{"layer": g.label, "class": g.cls, "probes": g.counts(),
                 "trap": first_trap(g.diagnosis) or ("-" if g.diagnosis.healthy
                                                     else "not named")}
                for g in self.groups]  # fmt: skip
        return pd.DataFrame(rows, columns=["layer", "class", "probes", "trap"])

    def text(self) -> str:
        layers = sum(len(g.paths) for g in self.groups)
        lines = [f"attention doctor: {self.target} ({self.model_class}: {layers} attention "
                 f"layer(s) in {len(self.groups)} group(s), the first of each probed)"]  # fmt: skip
        lines += [f"  {note}" for note in self.notes]
        if self.groups:
            lines.append(self.layer_table().to_string(index=False))
        for g in self.groups:  # a cause read from the forward first, what it explains under it
            read = [c for c in g.diagnosis.causes if c.read]
            by_probe = {f.probe: f for f in g.diagnosis.findings}
            for cause in read:
                lines.append(f"FAIL  {g.paths[0]}: {cause.trap} at {cause.at}: {cause.fit}")
                lines += explained_lines(cause, by_probe, 6)
            under = {probe for cause in read for probe in cause.probes}
            bad = [f for f in g.diagnosis.findings
                   if f.status in (FAIL, WARN) and f.probe not in under]  # fmt: skip
            lines += [f"{f.status.upper():<4}  {g.paths[0]}: {f.probe}  {f.message}" for f in bad]
        width = max((len(f.probe) for f in self.properties), default=0)
        lines.append("model:")
        lines += [f"{f.status.upper():<4}  {f.probe:<{width}}  {f.message}".rstrip()
                  for f in self.properties]  # fmt: skip
        problems = len(self.failures) + sum(not g.diagnosis.healthy for g in self.groups)
        lines.append("=> healthy" if self.healthy else f"=> {problems} problem(s)")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(
            {
                "target": self.target,
                "model_class": self.model_class,
                "healthy": self.healthy,
                "notes": self.notes,
                "layers": [
                    {
                        "paths": g.paths,
                        "class": g.cls,
                        "healthy": g.diagnosis.healthy,
                        "trap": first_trap(g.diagnosis) or None,
                        "findings": [asdict(f) for f in g.diagnosis.findings],
                    }
                    for g in self.groups
                ],
                "model": [{**asdict(f), "trap": named_trap([f]) or None} for f in self.properties],
            },
            indent=2,
        )

    def markdown(self) -> str:
        lines = [
            *markdown_header(self.target, self.healthy, "; ".join([self.model_class, *self.notes])),
            "",
            "## Attention layers",
            "",
            self.layer_table().to_markdown(index=False),
            "",
            "## The model",
            "",
            findings_table(self.properties).to_markdown(index=False),
        ]
        for g in self.groups:
            lines += ["", f"## `{g.paths[0]}`", "", g.diagnosis.table().to_markdown(index=False)]
        return "\n".join(lines) + "\n"
