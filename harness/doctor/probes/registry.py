"""The probe registry: each probe is written once, registered under its name, and returns its
outcome; the name is attached when the finding is made. Probes share nothing but the Subject,
whose derived facts (such as determinism) are computed on first use, so order does not matter."""

from __future__ import annotations

import functools
from collections.abc import Callable

from harness.doctor.findings import Outcome, skipped
from harness.doctor.subject import Subject

Probe = Callable[[Subject], Outcome]
PROBES: dict[str, Probe] = {}


NOT_DETERMINISTIC = (
    "not deterministic in eval mode (see eval determinism): two calls cannot be compared"
)


def probe(name: str, compares: bool = False) -> Callable[[Probe], Probe]:
    """Register a probe under ``name``; names are unique. A probe that ``compares`` the outputs
    of different calls is skipped for a module whose two identical calls already differ
    (dropout left on): any difference would be the randomness, named as some other trap."""

    def register(function: Probe) -> Probe:
        if name in PROBES:
            raise ValueError(f"a probe named {name!r} is already registered")

        @functools.wraps(function)
        def checked(subject: Subject) -> Outcome:
            if compares and not _deterministic(subject):
                return skipped(NOT_DETERMINISTIC)
            return function(subject)

        PROBES[name] = checked
        return function

    return register


def _deterministic(subject: Subject) -> bool:
    """Two identical calls agree; True when they cannot be made (the probe then says why)."""
    try:
        return subject.deterministic
    except Exception:
        return True
