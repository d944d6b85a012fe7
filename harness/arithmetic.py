"""What makes this machine's float32 arithmetic its own, read without importing torch.

Two families of CPU kernels round float32 differently from machine to machine: ATen's own
vector kernels (softmax, reductions, SDPA), which torch picks by the CPU's features unless
``ATEN_CPU_CAPABILITY`` says otherwise, and MKL's matmul path (``mm``, ``bmm``, ``Linear``), which
MKL picks by the CPU's vendor and features unless ``MKL_CBWR`` or ``MKL_ENABLE_INSTRUCTIONS``
says otherwise (it differs between Intel and AMD whatever ATen does). A number made under one
identity is served and compared as the same machine's only under the same identity: the result
store's key and the report's "same machine?" line both hold it.
"""

from __future__ import annotations

import hashlib
import os
import platform
from functools import cache

# The settings that move one family or the other (read from the environment at start-up).
KNOBS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS")


@cache
def cpuinfo() -> dict[str, str]:
    """The first processor's ``/proc/cpuinfo`` fields; empty where there is none."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if not line.strip():
                    break  # the first processor's block ends here
                name, _, value = line.partition(":")
                fields[name.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_name() -> str:
    """The CPU's model name, else what ``platform`` knows of it."""
    return cpuinfo().get("model name") or platform.processor() or platform.machine() or "unknown"


def vendor() -> str:
    """The CPU's vendor (``GenuineIntel``, ``AuthenticAMD``, ...); MKL chooses its path by it."""
    return cpuinfo().get("vendor_id") or platform.machine() or "unknown"


def settings() -> str:
    """The knobs set here, ``NAME=value`` joined by spaces; "" when none is."""
    return " ".join(f"{k}={os.environ[k]}" for k in KNOBS if os.environ.get(k))


def identity() -> str:
    """A hash of everything here that decides how float32 rounds: the vendor, the model, the
    feature flags (which kernels ATen and MKL may choose), the machine type and the knobs."""
    info = cpuinfo()
    parts = [vendor(), cpu_name(), info.get("flags", ""), platform.machine(), settings()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def describe(kernels: str) -> str:
    """The report's line on the machine: model, vendor, ATen's ``kernels`` and the knobs set."""
    knobs = settings()
    return (
        f"{cpu_name()} ({vendor()}), ATen {kernels} kernels, "
        + (f"set: {knobs}" if knobs else "no arithmetic settings")
        + f" (identity {identity()[:12]})"
    )
