"""Run every registered probe on a module and collect the findings."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

from harness.doctor.convention import detect
from harness.doctor.findings import Diagnosis, Finding, failed
from harness.doctor.probes import PROBES, Probe
from harness.doctor.subject import Config, Subject
from harness.errors import UsageError
from harness.runner import describe, seeded


@contextmanager
def _isolated(seed: int) -> Iterator[None]:
    """Each probe starts from the same seeded RNG, so a module that samples gives the same
    evidence whichever probes ran before; warnings are the probes' own business."""
    with seeded(seed), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def examine(name: str, probe: Probe, subject: Subject) -> Finding:
    """One probe's finding; a probe that raises fails with the exception as its evidence."""
    try:
        with _isolated(subject.config.seed):
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
