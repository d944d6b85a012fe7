"""The doctor's one recorded forward: the subject called as the probes call it, on ordinary
inputs (seeded, its mask as declared), read (``harness.doctor.reading.facts``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.doctor.reading.facts import Reading, read
from harness.doctor.reading.record import built_at

if TYPE_CHECKING:
    from harness.doctor.subject import Subject

SEED = 11  # the recorded call's inputs: any seed; not one a probe uses


def watch(subject: Subject) -> Reading:
    """Record one call of a copy of the subject on ordinary inputs, and read it."""
    config = subject.config
    module = subject.copy()
    x = subject.x(config.batch, config.seq_len, SEED)
    keep = subject.ordinary_keep(config.batch, config.seq_len)
    return read(
        module,
        lambda: subject.call(module, x, keep),
        {"x": x},
        subject.d_model,
        keep=keep,
        declared_scale=config.scale,
        made=lambda name: made_where(subject, name),
        causal=config.causal,
    )


def made_where(subject: Subject, name: str) -> str:
    """Where the module's tensor ``name`` was made, when the doctor built it (a wrapper's
    name has one more part than the module's)."""
    for module in (subject.module, subject.original):
        for candidate in (name, name.split(".", 1)[-1]):
            line = built_at(module, candidate)
            if line:
                return line
    return ""
