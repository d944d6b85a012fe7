"""An independent reference: a module's own projections through F.scaled_dot_product_attention.

Projections are recognized by common attribute names (separate q/k/v, fused qkv, an output
projection), and only when they are all of the module's parameters.
"""

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


# Projection names in common code: separate q/k/v, fused qkv, and the output projection.
SEPARATE = (
    ("W_q", "W_k", "W_v"),
    ("q_proj", "k_proj", "v_proj"),
    ("query", "key", "value"),
    ("to_q", "to_k", "to_v"),
    ("wq", "wk", "wv"),
    ("q", "k", "v"),
    ("Wq", "Wk", "Wv"),
    ("w_q", "w_k", "w_v"),
    ("q_lin", "k_lin", "v_lin"),
    ("linear_q", "linear_k", "linear_v"),
    ("query_proj", "key_proj", "value_proj"),
)
FUSED = ("c_attn", "qkv", "to_qkv", "W_qkv", "Wqkv", "w_qkv", "qkv_proj", "in_proj", "qkv_linear")
OUTPUT = ("W_o", "w_o", "Wo", "wo", "o_proj", "out_proj", "c_proj", "to_out", "proj", "o", "out",
          "dense", "output", "fc_out", "linear_out", "out_linear")  # fmt: skip
HEAD_ATTRS = (
    "n_heads", "num_heads", "heads", "n_head", "nhead", "h", "num_attention_heads", "head_count",
    "n_heads_q", "num_head", "attention_heads",
)  # fmt: skip


def head_count(module: nn.Module) -> int:
    """The module's head count: an attribute under a common name, or its ``config``'s; else 1."""
    for owner in (module, getattr(module, "config", None)):
        for name in HEAD_ATTRS:
            value = getattr(owner, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return 1


def _is_mask(buffer: Tensor) -> bool:
    """A bool, 0/1 or 0/-inf buffer: a mask, which SDPA given the same mask reproduces."""
    if buffer.dtype == torch.bool or not buffer.is_floating_point():
        return True
    finite = buffer[torch.isfinite(buffer)]
    return bool(((finite == 0) | (finite == 1)).all()) and not bool((buffer == math.inf).any())


Recognized = tuple[Callable[[Tensor], tuple[Tensor, Tensor, Tensor]], nn.Module | None, int, str]


def recognize(module: nn.Module) -> Recognized | None:
    """(q/k/v function, output projection, heads, description), or None when not recognized.

    Recognized only when those projections are all of the module's parameters, so a module
    with anything else (norms, rotary tables, gates) is not compared.
    """
    inner = (
        module.mha if isinstance(getattr(module, "mha", None), nn.MultiheadAttention) else module
    )
    if isinstance(inner, nn.MultiheadAttention):
        d = inner.embed_dim

        def qkv_mha(x):
            return F.linear(x, inner.in_proj_weight, inner.in_proj_bias).split(d, dim=-1)

        return (
            qkv_mha,
            inner.out_proj,
            inner.num_heads,
            "nn.MultiheadAttention's in_proj and out_proj",
        )
    linears = {n: m for n, m in inner.named_children() if isinstance(m, nn.Linear)}
    qkv, used = None, []
    for names in SEPARATE:
        if all(n in linears for n in names):
            q, k, v = (linears[n] for n in names)

            def qkv(x, q=q, k=k, v=v):
                return q(x), k(x), v(x)

            used = list(names)
            break
    if qkv is None:
        for name in FUSED:
            if name in linears and linears[name].out_features % 3 == 0:
                fused = linears[name]

                def qkv(x, fused=fused):
                    return fused(x).chunk(3, dim=-1)

                used = [name]
                break
    if qkv is None:
        return None
    out = next((linears[n] for n in OUTPUT if n in linears), None)
    if out is not None:
        used.append(next(n for n in OUTPUT if n in linears))
    covered = {id(p) for n in used for p in linears[n].parameters()}
    if any(id(p) not in covered for p in inner.parameters()):
        return None
    if not all(_is_mask(b) for b in inner.buffers()):  # slopes, rotary tables, ...
        return None
    heads = head_count(inner)
    return qkv, out, heads, ", ".join(used) + f" with {heads} head(s)"


def attend(
    found: Recognized,
    x: Tensor,
    keep: Tensor | None,
    kernel: Kernel = F.scaled_dot_product_attention,
) -> Tensor:
    """The recognized projections through ``kernel`` (SDPA unless told otherwise).

    ``keep`` is the bool keep-mask (B, T, T), True = attend (SDPA's convention).
    """
    qkv, out_proj, heads, _ = found
    B, T, _ = x.shape
    q, k, v = (t.reshape(B, T, heads, -1).transpose(1, 2) for t in qkv(x))  # (B, h, T, d)
    mask = None if keep is None else keep[:, None].to(x.device)  # (B, 1, T, T)
    out = kernel(q, k, v, attn_mask=mask)  # (B, h, T, d)
    out = out.transpose(1, 2).reshape(B, T, -1)  # (B, T, h * d)
    return out if out_proj is None else out_proj(out)


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
        ref64, low = as_dtype(module, device, torch.float64), as_dtype(module, device, dtype)
        found64, found_low = recognize(ref64), recognize(low)
        if found64 is None or found_low is None:
            raise ValueError(f"{type(module).__name__}: its projections are not recognized")
        ref = attend(found64, x.to(device), keep)
        x_low = x.to(device, dtype)
        floor = max(
            (
                metrics.error(attend(found_low, x_low, keep, kernel).double().cpu(), ref.cpu())
                for kernel in (F.scaled_dot_product_attention, math_attention)
            ),
            key=lambda e: e.max_abs,
        )
        args = (x_low,) if module_mask is None else (x_low, module_mask)
        out, _ = split_output(low(*args))
        err = metrics.error(out.double().cpu(), ref.cpu())
    return err, floor, metrics.atol(ref.cpu(), dtype)
