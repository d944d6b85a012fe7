"""Run every registered probe on a module and collect the findings.

The user's code runs only inside ``guarded()``: each probe, the detection of the mask convention
and the first calls that find the input width, each with its own time limit. Exiting or running
past the limit fails that step; the process's global settings are restored after each.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import replace

import torch
from torch import nn

from harness.devices import resolve_device
from harness.doctor.causality import causal_as_said
from harness.doctor.causes import explain
from harness.doctor.config import Config, quietly_seeded
from harness.doctor.convention import NAME as CONVENTION
from harness.doctor.convention import detect
from harness.doctor.findings import FAIL, SKIP, Diagnosis, Finding, Said, failed, skipped
from harness.doctor.guard import TIMEOUT, UserCodeError, guarded
from harness.doctor.named import leading
from harness.doctor.probes import PROBES, Probe
from harness.doctor.probes.numerics import HALF_FILL, HALF_FILL_NAMED
from harness.doctor.reading.checks import read_failures
from harness.doctor.reading.known import COMPUTED, Fact, Reading
from harness.doctor.reading.watch import Watched, watch
from harness.doctor.subject import Subject
from harness.errors import UsageError
from harness.inputs import check_seed
from harness.runner import describe

SETUP = "calling the module"  # the finding when the module cannot even be called to be probed
# A probe whose inputs the module (or its --call adapter) refuses with NotImplementedError is
# skipped: an input its model never passes (d2l's valid_lens can only pad on the right).
NOT_TAKEN = "the module or its adapter does not take this probe's input"


def evidence(exc: Exception) -> Said:
    """What an exception from the user's code is reported as; a mask fill past float16's
    range named as its trap, wherever it raises (a model that autocasts itself)."""
    said = str(exc) if isinstance(exc, UserCodeError) else f"raises: {describe(exc)}"
    return said + (HALF_FILL_NAMED if HALF_FILL.search(said) else Said(""))


def examine(name: str, probe: Probe, subject: Subject, timeout: float | None = TIMEOUT) -> Finding:
    """One probe's finding; a probe that raises, exits or runs past ``timeout`` seconds fails
    with that as its evidence. Usage errors and KeyboardInterrupt pass through."""
    try:
        with guarded(timeout), quietly_seeded(subject.config.seed):
            outcome = probe(subject)
    except UsageError:
        raise
    except NotImplementedError as exc:  # the module or its adapter says it takes no such input
        outcome = skipped(f"{NOT_TAKEN}: {describe(exc)}")
    except Exception as exc:
        outcome = failed(evidence(exc))
    return Finding.of(name, outcome)


def read_forward(subject: Subject, timeout: float | None) -> Callable[[bool], Reading]:
    """The one recorded forward, to be read as causal or not; a call that exits, hangs or
    breaks leaves a reading that says so (the probes report it as their own failures)."""
    try:
        with guarded(timeout), quietly_seeded(subject.config.seed):
            watched = watch(subject)
            if watched.finite or not subject.float32_if_finite():
                return watched.reading
            watched = watch(subject)  # in the dtype the probes will run it in
        return functools.partial(_in_float32, watched)
    except UsageError:
        raise
    except Exception as exc:
        stopped = Reading(facts=[Fact("recorded forward", f"stopped: {evidence(exc).text}")])
        return lambda causal: stopped


def _in_float32(watched: Watched, causal: bool) -> Reading:
    """The reading of a forward recorded in float32, saying why."""
    reading = watched.reading(causal)
    reading.facts.append(Fact("probed in", FLOAT32, COMPUTED))
    return reading


FLOAT32 = "float32: in float64 an ordinary call is not finite, in float32 it is"


def called_once(module: nn.Module, config: Config, timeout: float | None = TIMEOUT,
                seq_len: int | None = None, unpadded: bool = False) -> object:  # fmt: skip
    """A copy of ``module`` called as the probes call it, once (its convention found first),
    on ``seq_len`` tokens where given: its output and weights as the probes read them; what
    the call raises, it raises. ``unpadded``: with a mask that pads nothing (the causal
    probe's), which may take a branch of its own (a shortcut for a batch with no padding)."""
    if seq_len is not None:
        config = replace(config, seq_len=seq_len)
    with guarded(timeout):
        found, _ = detect(module, config)
        subject = Subject(module, found)
        subject.settle()
        batch, seq_len = subject.config.batch, subject.config.seq_len
        keep = subject.ordinary_keep(batch, seq_len)
        if unpadded and keep is not None:
            keep = torch.ones_like(keep)
            keep = keep.tril() if subject.config.causal else keep
        with quietly_seeded(found.seed), torch.no_grad():
            return subject.call(subject.copy(), subject.x(batch, seq_len, 0), keep)


def diagnose(
    module: nn.Module,
    config: Config | None = None,
    target: str = "",
    timeout: float | None = TIMEOUT,
    progress: Callable[[str], None] | None = None,
    crashed: Mapping[str, str] | None = None,
    skip: Mapping[str, str] | None = None,
) -> Diagnosis:
    """Run every probe on a copy of ``module``; the module itself is left as it was.

    ``skip``: probes not run, each with the reason it reports (the model doctor's, for a layer
    whose positions come from its model).

    ``timeout``: seconds each probe may run (None or 0: no limit). ``progress`` is called with
    each step's name before it runs (``len(STEPS)`` calls at most). A device that is not
    available here is a UsageError, before anything runs.
    """
    report = progress or (lambda step: None)
    config = config or Config()
    resolve_device(config.device)
    check_seed(config.seed)
    name = target or type(module).__name__
    step = CONVENTION
    try:
        report(step)
        with guarded(timeout):
            config, detected = detect(module, config)
        step = SETUP
        report(step)
        with guarded(timeout):
            subject = Subject(module, config)
            subject.settle()  # its width and dtype, found by calling it
        reading_of = read_forward(subject, timeout)
        subject.reading = reading_of(config.causal)
        with guarded(timeout):
            said = causal_as_said(subject, subject.reading)  # causal, as it shows
            if said is not None:
                dtype, subject = subject.dtype, Subject(module, said[0])
                subject.settle()
                if dtype != subject.dtype:  # as the recorded forward found it runs
                    subject.float32_if_finite()
    except UsageError:
        raise
    except Exception as exc:  # the module exits, hangs or breaks before any probe can run
        return Diagnosis(name, config, [Finding.of(step, failed(evidence(exc)))])
    reading = subject.reading = reading_of(subject.config.causal)
    diagnosis = Diagnosis(name, subject.config, facts=reading.facts,  # as probed
                          head_width=reading.head_width)  # fmt: skip
    diagnosis.findings.extend(f for f in (detected, said and said[1]) if f)
    for probe_name, probe in PROBES.items():
        report(probe_name)
        if crashed and probe_name in crashed:
            diagnosis.findings.append(Finding(probe_name, FAIL, crashed[probe_name]))
            continue
        if skip and probe_name in skip:
            diagnosis.findings.append(Finding(probe_name, SKIP, skip[probe_name]))
            continue
        diagnosis.findings.append(examine(probe_name, probe, subject, timeout))
    diagnosis.findings += read_failures(reading, diagnosis.findings)
    diagnosis.causes = explain(diagnosis.findings, subject.config, reading)
    if not any(cause.read for cause in diagnosis.causes):
        diagnosis.lead = leading(diagnosis.findings)
    return diagnosis


STEPS = (CONVENTION, SETUP, *PROBES)  # what ``progress`` is told, in order
