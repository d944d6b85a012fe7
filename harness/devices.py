"""Which devices and dtypes exist here, checked before any work starts."""

from __future__ import annotations

import torch

from harness.errors import UsageError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEVICE_KINDS = ("cpu", "cuda")


def available_devices() -> list[str]:
    """cpu, plus cuda when torch sees a GPU."""
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def resolve_device(name: str) -> torch.device:
    """A torch.device for ``name``, or UsageError when it does not exist here."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(
            f"unknown device {name!r}; use one of: {', '.join(DEVICE_KINDS)}"
        ) from None
    if device.type not in DEVICE_KINDS:
        raise UsageError(f"unknown device {name!r}; use one of: {', '.join(DEVICE_KINDS)}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device {name!r} is not available here (no CUDA device visible to torch)")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise UsageError(
            f"device {name!r} does not exist: {torch.cuda.device_count()} CUDA devices"
        )
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The dtype called ``name``, checked to run attention's operations on ``device``."""
    if name not in DTYPES:
        raise UsageError(f"unknown dtype {name!r}; use one of: {', '.join(DTYPES)}")
    dtype = DTYPES[name]
    try:
        x = torch.ones(2, 3, 3, dtype=dtype, device=device)
        torch.bmm(x, x).softmax(-1).sum().item()
    except (RuntimeError, TypeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(f"dtype {name} does not run on {device}: {reason}") from None
    return dtype


def device_description(device: torch.device) -> str:
    """``cpu`` or the GPU's name."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``: the one way the harness writes a dtype."""
    return str(dtype).removeprefix("torch.")
