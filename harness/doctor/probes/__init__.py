"""The doctor's probes, one file per family; importing this package registers every one."""

from harness.doctor.probes import contract, leaks, numerics, reference
from harness.doctor.probes.registry import PROBES, Probe, probe

__all__ = ["PROBES", "Probe", "contract", "leaks", "numerics", "probe", "reference"]
