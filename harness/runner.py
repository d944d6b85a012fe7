"""Run one module forward and backward, capturing everything, raising nothing; or over seeds."""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pandas as pd
import torch
from torch import Tensor, nn

from harness import metrics
from harness.inputs import Inputs, upstream_gradient
from harness.masks import MaskSpec, encode
from harness.shapes import Shape

INPUT_GRAD = "input x"  # the name under which the gradient w.r.t. the input is kept


@dataclass
class Run:
    """What one forward/backward pass produced, in float64 on the CPU for comparison."""

    output: Tensor | None = None
    weights: Tensor | None = None
    grads: dict[str, Tensor] = field(default_factory=dict)
    error: str | None = None  # "TypeName: message" of the first exception, if any
    refused: bool = False  # that exception is NotImplementedError: the input is not one it takes
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def first_nonfinite(self) -> str | None:
        """Where the first NaN or Inf is: in the output, else in a gradient; None if nowhere."""
        named = [("output", self.output)] + [(f"grad of {k}", g) for k, g in self.grads.items()]
        for name, tensor in named:
            where = None if tensor is None else metrics.first_nonfinite(tensor)
            if where is not None:
                return name + where
        return None


def describe(exc: BaseException) -> str:
    """``TypeName: first line of the message`` (a message that cannot be made says so)."""
    try:
        text = str(exc)
    except Exception:  # a user's exception whose __str__ raises
        text = "(its message raised an exception)"
    lines = text.strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def manual_seed(seed: int) -> None:
    """``torch.manual_seed(seed)`` for the generators in use: the CPU's, and CUDA's where CUDA
    is available. torch.manual_seed also queues a lazy seed for every other device type with a
    captured stack, about 64 µs a call on a CPU-only torch, which the report pays 15,000 times;
    the CPU generator's stream is the same either way."""
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run a block under ``manual_seed(seed)`` and restore the global CPU RNG afterwards."""
    with torch.random.fork_rng(devices=[]):
        manual_seed(seed)
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


def plain_call(mask: Tensor | None) -> Callable[[nn.Module, Tensor], object]:
    """``(module, x) -> module(x)``, or ``module(x, mask)`` when there is a mask."""
    return lambda module, x: module(x) if mask is None else module(x, mask)


def as_dtype(module: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """A copy of ``module`` on ``device`` in ``dtype``; the original is left alone.

    Complex parameters and buffers (Meta's rotary ``freqs_cis``) become the matching complex
    dtype, not ``dtype``: ``Module.to(float64)`` would drop their imaginary part."""
    complex_dtype = torch.complex128 if dtype == torch.float64 else torch.complex64

    def cast(t: Tensor) -> Tensor:
        if t.is_complex():
            return t.to(device, complex_dtype)
        return t.to(device, dtype) if t.is_floating_point() else t.to(device)

    return copy.deepcopy(module)._apply(cast)


def run(
    module: nn.Module,
    x: Tensor,
    mask: Tensor | None,
    upstream: Callable[[torch.Size], Tensor] | Tensor | None,
    call: Callable[[nn.Module, Tensor], object] | None = None,
) -> Run:
    """Forward ``x`` (already on the device, in the dtype) and backward ``sum(out * G)``.

    The module is called as ``module(x)`` or ``module(x, mask)``, or as ``call(module, x)`` says
    (a scenario of ``harness.scenarios``: decode through a cache, long positions, ...).

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
            call = call or plain_call(mask)
            output, weights = split_output(call(module, x))
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
            result.refused = isinstance(exc, NotImplementedError)
    result.warnings = sorted({f"{w.category.__name__}: {w.message}" for w in caught})
    return result


@dataclass
class SeedStats:
    """One module's behaviour over seeds, each seed a fresh module and a fresh draw."""

    attention: dict[str, float]  # averaged attention statistics (empty when it raised)
    grad_norms: dict[str, float]  # mean gradient norm per parameter (and the input)
    error: str | None  # the first exception, if any
    weights: Tensor | None  # attention weights of the first seed, for pictures
    keep: Tensor | None = None  # the allowed keys (B, T, T) of the inputs of those weights


def seed_stats(
    build: Callable[[Shape], nn.Module],
    draw: Callable[[Shape, int], Inputs],
    spec: MaskSpec | None,
    device: torch.device,
    dtype: torch.dtype,
    shape: Shape,
    seeds: range,
) -> SeedStats:
    """Attention statistics and gradient norms of ``build``'s module, averaged over ``seeds``.

    For each seed the module is built under that seed and run on ``draw(shape, seed)``, its mask
    passed as ``spec`` says. The global RNG is left alone.
    """
    att_rows, norms, first_weights, first_keep = [], {}, None, None
    for seed in seeds:
        with seeded(seed):
            module = build(shape).eval()
        inputs = draw(shape, seed)
        mask = encode(inputs.keep, spec, device, dtype)
        with exact_float32(device):
            result = run(
                as_dtype(module, device, dtype),
                inputs.x.to(device, dtype),
                mask,
                lambda out_shape, s=seed: upstream_gradient(out_shape, s),
            )
        if not result.ok:
            return SeedStats({}, {}, result.error, None)
        if first_weights is None:
            first_weights, first_keep = result.weights, inputs.keep
        att_rows.append(metrics.attention_stats(result.weights, inputs.keep))
        for name, grad in result.grads.items():
            norms.setdefault(name, []).append(metrics.grad_stats(grad)["norm"])
    att = pd.DataFrame(att_rows)
    attention = dict(
        entropy_mean=att["entropy_mean"].mean(),
        entropy_std=att["entropy_mean"].std(ddof=0),
        entropy_min=att["entropy_min"].min(),
        saturated=att["saturated"].mean(),
        nan_rows=att["nan_rows"].sum(),
        row_sum_err=att["row_sum_err"].max(),
    )
    mean_norms = {k: sum(v) / len(v) for k, v in norms.items()}
    return SeedStats(attention, mean_norms, None, first_weights, first_keep)
