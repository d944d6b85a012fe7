"""The probe registry: each probe is written once, registered under its name, and returns its
outcome; the name is attached when the finding is made. Probes share nothing but the Subject,
whose derived facts (such as determinism) are computed on first use, so order does not matter."""

from __future__ import annotations

from collections.abc import Callable

from harness.doctor.findings import Outcome
from harness.doctor.subject import Subject

Probe = Callable[[Subject], Outcome]
PROBES: dict[str, Probe] = {}


def probe(name: str) -> Callable[[Probe], Probe]:
    """Register a probe under ``name``; names are unique."""

    def register(function: Probe) -> Probe:
        if name in PROBES:
            raise ValueError(f"a probe named {name!r} is already registered")
        PROBES[name] = function
        return function

    return register
