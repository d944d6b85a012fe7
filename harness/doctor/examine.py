"""Run every registered probe on a module and collect the findings."""

from __future__ import annotations

from torch import nn

from harness.doctor.convention import detect
from harness.doctor.findings import Diagnosis, Finding, failed
from harness.doctor.probes import PROBES, Probe
from harness.doctor.subject import Config, Subject, quietly_seeded
from harness.errors import UsageError
from harness.runner import describe


def examine(name: str, probe: Probe, subject: Subject) -> Finding:
    """One probe's finding; a probe that raises fails with the exception as its evidence."""
    try:
        with quietly_seeded(subject.config.seed):
            outcome = probe(subject)
    except UsageError:
        raise
    except Exception as exc:
        outcome = failed(f"raises: {describe(exc)}")
    return Finding(name, outcome.status, outcome.message)


def diagnose(module: nn.Module, config: Config | None = None, target: str = "") -> Diagnosis:
    """Run every probe on a copy of ``module``; the module itself is left as it was."""
    config, detected = detect(module, config or Config())
    subject = Subject(module, config)
    diagnosis = Diagnosis(target or type(module).__name__, config)
    diagnosis.findings.extend([detected] if detected else [])
    diagnosis.findings.extend(examine(name, p, subject) for name, p in PROBES.items())
    return diagnosis
