"""Which devices and dtypes exist here, checked before any work starts."""

from __future__ import annotations

import torch

from harness.defaults import DTYPE_NAMES
from harness.errors import UsageError, did_you_mean, shorten

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}  # float32, bfloat16, float16
DEVICE_KINDS = ("cpu", "cuda")
GPU_WORDS = ("gpu", "nvidia", "rocm", "hip")  # what people type for torch's "cuda"


def available_devices() -> list[str]:
    """cpu, plus cuda when torch sees a GPU."""
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def resolve_device(name: str) -> torch.device:
    """A torch.device for ``name``, or UsageError when it does not exist here.

    One device has one name: ``cpu:0`` is ``cpu`` and ``cuda:0`` is ``cuda`` (torch's first
    GPU), so equal devices compare equal; ``cpu:1`` does not exist (the CPU is one device).
    """
    shown = shorten(name, quote=True)
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        device = None
    if device is None or device.type not in DEVICE_KINDS:
        kind = name.partition(":")[0]
        if kind in DEVICE_KINDS:  # cuda:x, cuda:-1, cpu:
            raise UsageError(f"unknown device {shown}; use cpu, cuda or cuda:N (N: a GPU number)")
        if name.strip().lower() != name and kind.strip().lower() in DEVICE_KINDS:  # CPU, " cuda"
            raise UsageError(f"unknown device {shown}; did you mean {name.strip().lower()!r}?")
        guess = kind.strip().lower()
        hint = (
            did_you_mean(guess, DEVICE_KINDS) if guess not in GPU_WORDS else "did you mean 'cuda'?"
        )
        raise UsageError(f"unknown device {shown}; {hint or 'use one of: cpu, cuda'}")
    if device.type == "cpu":
        if device.index:
            raise UsageError(f"device {shown} does not exist: the CPU is one device, cpu")
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UsageError(f"device {shown} is not available here (no CUDA device visible to torch)")
    count = torch.cuda.device_count()
    if (device.index or 0) >= count:
        raise UsageError(
            f"device {shown} does not exist: {count} CUDA device{'s' if count != 1 else ''} "
            f"(cuda:0{f' to cuda:{count - 1}' if count > 1 else ''})"
        )
    return torch.device("cuda") if not device.index else device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The dtype called ``name``, checked to run attention's operations on ``device``."""
    if name not in DTYPES:
        hint = did_you_mean(name, DTYPES) or f"use one of: {', '.join(DTYPES)}"
        raise UsageError(f"unknown dtype {shorten(name, quote=True)}; {hint}")
    dtype = DTYPES[name]
    try:
        x = torch.ones(2, 3, 3, dtype=dtype, device=device)
        torch.bmm(x, x).softmax(-1).sum().item()
    except (RuntimeError, TypeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"dtype {name} does not run on {device}: {reason}") from None
    return dtype


def cpu_kernels() -> str:
    """Which of torch's CPU kernels run here (AVX512, AVX2, DEFAULT, ...): set by the CPU, or
    by ``ATEN_CPU_CAPABILITY``; they round float32 differently."""
    return torch.backends.cpu.get_cpu_capability()


def device_description(device: torch.device) -> str:
    """``cpu`` or the GPU's name."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``: the one way the harness writes a dtype."""
    return str(dtype).removeprefix("torch.")
