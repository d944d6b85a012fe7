"""Wing 2, the doctor: black-box probes on anyone's self-attention module.

target (load and build the user's module) -> subject (how to call it) -> probes (one file per
family, each registered by name) -> findings (Finding, Diagnosis and its renderings); options
(the one table of what a user can declare) under them all.

Every probe runs on a private float64 copy in eval mode (low-precision probes on a copy in that
dtype), so a gradient that should be zero is exactly zero and the user's module is never touched:
its weights, training mode and the global RNG state are the same afterwards. Its code runs
inside guard.guarded(): what it prints is captured, sys.exit and hanging fail the step, and
torch's global settings are restored.

The names below are imported when first used, so that ``harness.doctor.options`` (plain data,
read by the pytest plugin as it loads) costs no torch import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.doctor.config import Config
    from harness.doctor.examine import STEPS, diagnose
    from harness.doctor.findings import FAIL, PASS, SKIP, WARN, Diagnosis, Finding
    from harness.doctor.guard import UserCodeError, guarded
    from harness.doctor.model.examine import diagnose_model
    from harness.doctor.options import OPTIONS, TIMEOUT

_HOMES = {
    "STEPS": "examine", "diagnose": "examine", "diagnose_model": "model.examine",
    "FAIL": "findings", "PASS": "findings", "SKIP": "findings", "WARN": "findings",
    "Diagnosis": "findings", "Finding": "findings",
    "UserCodeError": "guard", "guarded": "guard",
    "OPTIONS": "options", "TIMEOUT": "options",
    "Config": "subject",
}  # fmt: skip

__all__ = [
    "FAIL",
    "OPTIONS",
    "PASS",
    "SKIP",
    "STEPS",
    "TIMEOUT",
    "WARN",
    "Config",
    "Diagnosis",
    "Finding",
    "UserCodeError",
    "diagnose",
    "diagnose_model",
    "guarded",
]  # fmt: skip  (every name of _HOMES; a test holds them equal)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
