"""Run one module forward and backward, capturing everything, raising nothing."""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from harness.metrics import first_nonfinite

INPUT_GRAD = "input x"  # the name under which the gradient w.r.t. the input is kept


@dataclass
class Run:
    """What one forward/backward pass produced, in float64 on the CPU for comparison."""

    output: Tensor | None = None
    weights: Tensor | None = None
    grads: dict[str, Tensor] = field(default_factory=dict)
    error: str | None = None  # "TypeName: message" of the first exception, if any
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def first_nonfinite(self) -> str | None:
        """Where the first NaN or Inf is: in the output, else in a gradient; None if nowhere."""
        named = [("output", self.output)] + [(f"grad of {k}", g) for k, g in self.grads.items()]
        for name, tensor in named:
            where = None if tensor is None else first_nonfinite(tensor)
            if where is not None:
                return name + where
        return None


def describe(exc: BaseException) -> str:
    """``TypeName: first line of the message``."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run a block under ``torch.manual_seed(seed)`` and restore the global RNG afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def exact_float32(device: torch.device) -> Iterator[None]:
    """Turn TF32 off on CUDA for the duration, so float32 means float32."""
    if device.type != "cuda":
        yield
        return
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def split_output(result: object) -> tuple[Tensor, Tensor | None]:
    """Accept ``output`` or ``(output, weights)`` from a forward."""
    if isinstance(result, Tensor):
        return result, None
    if isinstance(result, tuple | list) and result and isinstance(result[0], Tensor):
        weights = result[1] if len(result) > 1 and isinstance(result[1], Tensor) else None
        return result[0], weights
    raise TypeError(f"forward returned {type(result).__name__}, expected a tensor or a tuple")


def as_dtype(module: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """A copy of ``module`` on ``device`` in ``dtype``; the original is left alone."""
    return copy.deepcopy(module).to(device=device, dtype=dtype)


def run(
    module: nn.Module,
    x: Tensor,
    mask: Tensor | None,
    upstream: Callable[[torch.Size], Tensor] | Tensor | None,
) -> Run:
    """Forward ``x`` (already on the device, in the dtype) and backward ``sum(out * G)``.

    ``upstream`` is G, or a function from the output shape to G (used for the reference run,
    whose shape defines G). With ``None`` only the forward runs. The module is expected to be a
    private copy: its ``.grad`` fields are not touched (``torch.autograd.grad`` is used).
    """
    result = Run()
    x = x.detach().requires_grad_(True)
    params = dict(module.named_parameters())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            output, weights = split_output(module(x) if mask is None else module(x, mask))
            result.output = output.detach().to("cpu", torch.float64)
            if weights is not None:
                result.weights = weights.detach().to("cpu", torch.float64)
            G = upstream(output.shape) if callable(upstream) else upstream
            if G is not None and G.shape == output.shape:  # else: nothing comparable to backward
                loss = (output * G.to(output.device, output.dtype)).sum()
                names = [INPUT_GRAD, *params]
                grads = torch.autograd.grad(loss, [x, *params.values()], allow_unused=True)
                for name, grad, source in zip(names, grads, [x, *params.values()], strict=True):
                    grad = torch.zeros_like(source) if grad is None else grad
                    result.grads[name] = grad.detach().to("cpu", torch.float64)
        except Exception as exc:  # the point is to record it, whatever it is
            result.error = describe(exc)
    result.warnings = sorted({f"{w.category.__name__}: {w.message}" for w in caught})
    return result
