"""The doctor's probes, one file per family; importing this package registers every one."""

from harness.doctor.probes import (
    contract,
    generation,
    heads,
    leaks,
    numerics,
    positions,
    reference,
    window,
)
from harness.doctor.probes.registry import PROBES, Probe, probe

__all__ = [
    "PROBES", "Probe", "contract", "generation", "heads", "leaks", "numerics", "positions", "probe",
    "reference", "window",
]  # fmt: skip
