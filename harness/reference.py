"""An independent reference: the same projections through F.scaled_dot_product_attention."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness import metrics
from harness.runner import as_dtype, exact_float32, split_output

Kernel = Callable[..., Tensor]


def math_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None) -> Tensor:
    """Textbook attention in the inputs' dtype: softmax(q k^T / sqrt(d)) v."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., T, T)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return scores.softmax(dim=-1) @ v  # (..., T, d_v)


def sdpa_forward(
    module: nn.Module,
    x: Tensor,
    keep: Tensor | None,
    kernel: Kernel = F.scaled_dot_product_attention,
) -> Tensor:
    """Output of ``module``'s W_q/W_k/W_v (and W_o, when present) through ``kernel``.

    Works for the catalogue's modules: single-head (no ``n_heads``) or fused multi-head with
    ``n_heads``. ``keep`` is the bool keep-mask (B, T, T), True = attend (SDPA's convention).
    """
    heads = getattr(module, "n_heads", 1)
    q, k, v = module.W_q(x), module.W_k(x), module.W_v(x)  # (B, T, h * d)
    if heads > 1:
        B, T, _ = x.shape
        q, k, v = (t.view(B, T, heads, -1).transpose(1, 2) for t in (q, k, v))  # (B, h, T, d)
        keep = None if keep is None else keep[:, None]  # (B, 1, T, T)
    out = kernel(q, k, v, attn_mask=keep)
    if heads > 1:
        out = out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)  # (B, T, h * d)
    return module.W_o(out) if hasattr(module, "W_o") else out


def agreement(
    module: nn.Module,
    module_mask: Tensor | None,
    x: Tensor,
    keep: Tensor | None,
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[metrics.Error, metrics.Error, float]:
    """(module error, floor, atol), all against SDPA in float64.

    The floor is the larger error of two independent implementations run in ``dtype``: SDPA
    (whose fused CPU kernels accumulate in float32, so it alone would be an unfairly tight floor)
    and textbook math. ``x`` and ``keep`` are float64/bool on the CPU; ``module_mask`` is the
    mask in the module's own convention (already on ``device``) or None.
    """
    with exact_float32(device), torch.no_grad():
        ref64 = as_dtype(module, device, torch.float64)
        ref = sdpa_forward(ref64, x.to(device), None if keep is None else keep.to(device))
        low = as_dtype(module, device, dtype)
        x_low = x.to(device, dtype)
        keep_dev = None if keep is None else keep.to(device)
        floor = max(
            (
                metrics.error(sdpa_forward(low, x_low, keep_dev, kernel).double().cpu(), ref.cpu())
                for kernel in (F.scaled_dot_product_attention, math_attention)
            ),
            key=lambda e: e.max_abs,
        )
        args = (x_low,) if module_mask is None else (x_low, module_mask)
        out, _ = split_output(low(*args))
        err = metrics.error(out.double().cpu(), ref.cpu())
    return err, floor, metrics.atol(ref.cpu(), dtype)
