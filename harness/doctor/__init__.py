"""Wing 2, the doctor: black-box probes on anyone's self-attention module.

target (load and build the user's module) -> subject (how to call it) -> probes (one file per
family, each registered by name) -> findings (Finding, Diagnosis and its renderings).

Every probe runs on a private float64 copy in eval mode (low-precision probes on a copy in that
dtype), so a gradient that should be zero is exactly zero and the user's module is never touched:
its weights, training mode and the global RNG state are the same afterwards. Its code runs
inside guard.guarded(): what it prints is captured, sys.exit and hanging fail the step, and
torch's global settings are restored.
"""

from harness.doctor.examine import STEPS, diagnose
from harness.doctor.findings import FAIL, PASS, SKIP, WARN, Diagnosis, Finding
from harness.doctor.guard import TIMEOUT, UserCodeError, guarded
from harness.doctor.subject import (
    GROUPINGS,
    MASK_SHAPES,
    MASKS,
    PAIRINGS,
    POSITIONS,
    Config,
)

__all__ = [
    "FAIL", "GROUPINGS", "MASKS", "MASK_SHAPES", "PAIRINGS", "PASS", "POSITIONS", "SKIP",
    "STEPS", "TIMEOUT", "WARN",
    "Config", "Diagnosis", "Finding", "UserCodeError", "diagnose", "guarded",
]  # fmt: skip
