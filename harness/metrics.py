"""Error against a reference, the noise floor, attention and gradient statistics.

The floor rule follows FlashAttention's tests: a candidate differs from the float64 reference when
its max abs error exceeds ``factor * floor + atol``, where the floor is the error of the fixed
module run in the same dtype, ``factor`` is 2 for outputs and 3 for gradients, and
``atol = 2 * max|ref + 0.3 - 0.3 - ref|`` computed in the dtype (the arithmetic noise of one
add-subtract at the reference's magnitude).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

OUTPUT_FACTOR = 2.0
GRAD_FACTOR = 3.0
# Reordered sums round differently by a few units in the last place (ulps) of their scale: a
# rounding-level difference is stated and asserted as at most this many, never as a value,
# since another CPU's kernels round otherwise. A dependence on order or position moves outputs
# by far more.
ROUNDING_ULPS = 64
SATURATED = 0.99  # a row whose largest weight is at least this is saturated
DEGENERATE = 0.5  # attention is degenerate when at least this fraction of rows is saturated


@dataclass(frozen=True)
class Error:
    """How far a tensor is from its reference."""

    max_abs: float
    rel_l2: float

    @property
    def finite(self) -> bool:
        return math.isfinite(self.max_abs)


INFINITE = Error(math.inf, math.inf)


def error(test: Tensor | None, ref: Tensor) -> Error:
    """Max abs error and relative L2 error of ``test`` against ``ref`` (both float64).

    A missing tensor, a shape mismatch, or a non-finite value where the reference is finite
    counts as an infinite error.
    """
    if test is None or test.shape != ref.shape:
        return INFINITE
    test, ref = test.double(), ref.double()
    both_nan = test.isnan() & ref.isnan()
    same_inf = test.isinf() & ref.isinf() & (test == ref)
    agree = both_nan | same_inf
    if (~torch.isfinite(test) & ~agree).any() or (~torch.isfinite(ref) & ~agree).any():
        return INFINITE
    diff = (test - ref).masked_fill(agree, 0.0)
    ref_finite = ref.masked_fill(agree, 0.0)
    max_abs = diff.abs().max().item() if diff.numel() else 0.0
    norm = ref_finite.norm().item()
    rel = diff.norm().item() / norm if norm > 0 else (0.0 if max_abs == 0 else math.inf)
    return Error(max_abs, rel)


def atol(ref: Tensor, dtype: torch.dtype) -> float:
    """FlashAttention's arithmetic noise floor: ``2 * max|ref + 0.3 - 0.3 - ref|`` in ``dtype``."""
    r = ref.to(dtype)
    r = r.masked_fill(~torch.isfinite(r), 0.0)
    noise = (r + 0.3 - 0.3 - r).abs()
    return 2.0 * noise.max().item() if noise.numel() else 0.0


def one_ulp(ref: Tensor, dtype: torch.dtype) -> float:
    """One unit in the last place of ``ref``'s largest finite value in ``dtype`` (``eps *
    max|ref|``; 0 when it has none): what storing a result in ``dtype`` may cost twice over."""
    finite = ref[torch.isfinite(ref)]
    scale = finite.abs().max().item() if finite.numel() else 0.0
    return torch.finfo(dtype).eps * scale


def rounding(scale: float, dtype: torch.dtype = torch.float32) -> float:
    """How far rounding alone may move values of size ``scale`` (at least 1) in ``dtype``:
    ``ROUNDING_ULPS`` units of its machine epsilon at that scale."""
    return ROUNDING_ULPS * torch.finfo(dtype).eps * max(1.0, scale)


def threshold(floor: Error, tol: float, factor: float) -> float:
    """The largest error that still counts as rounding: ``factor * floor + atol``."""
    return factor * floor.max_abs + tol


def differs(candidate: Error, floor: Error, tol: float, factor: float) -> bool:
    """True when ``candidate`` is beyond the noise floor (non-finite always is)."""
    if not candidate.finite:
        return True
    return candidate.max_abs > threshold(floor, tol, factor)


def allowed_keys(weights: Tensor, keep: Tensor | None) -> Tensor:
    """Per row of ``weights``, how many keys the mask allows (T when unmasked or unaligned)."""
    seq_len = weights.shape[-1]
    full = torch.full(weights.shape[:-1], float(seq_len), dtype=torch.float64)
    if keep is None:
        return full
    if weights.dim() == 4 and keep.dim() == 3:
        keep = keep[:, None]  # (B, 1, T, T): the same mask for every head
    try:
        return torch.broadcast_to(keep, weights.shape).sum(-1).double()
    except RuntimeError:
        return full


def attention_stats(weights: Tensor | None, keep: Tensor | None) -> dict[str, float]:
    """Statistics of attention rows (the last axis of ``weights``).

    entropy_mean, entropy_min: row entropy divided by log(allowed keys), over finite rows with at
    least two allowed keys (1 = uniform over what is allowed, 0 = one-hot; above 1 means the row
    spreads over keys it should not see). saturated: fraction of finite rows whose largest weight
    is >= 0.99. nan_rows: rows holding a NaN. row_sum_err: max |row sum - 1| over finite rows.
    """
    nan = float("nan")
    if weights is None:
        return dict(entropy_mean=nan, entropy_min=nan, saturated=nan, nan_rows=nan, row_sum_err=nan)
    w = weights.double()
    n_allowed = allowed_keys(w, keep)  # (..., T)
    rows = w.reshape(-1, w.shape[-1])  # (rows, T)
    n_allowed = n_allowed.reshape(-1)  # (rows,)
    nan_row = rows.isnan().any(-1)
    finite_row = torch.isfinite(rows).all(-1)
    plogp = torch.where(rows > 0, rows * rows.clamp_min(1e-300).log(), torch.zeros_like(rows))
    entropy = -plogp.sum(-1) + 0.0  # (rows,); + 0.0 turns -0.0 into 0.0
    scored = finite_row & (n_allowed > 1)
    normalized = entropy[scored] / n_allowed[scored].log()
    fin = rows[finite_row]
    return dict(
        entropy_mean=normalized.mean().item() if normalized.numel() else nan,
        entropy_min=normalized.min().item() if normalized.numel() else nan,
        saturated=saturated_fraction(fin) if fin.numel() else nan,
        nan_rows=float(nan_row.sum().item()),
        row_sum_err=(fin.sum(-1) - 1).abs().max().item() if fin.numel() else nan,
    )


def first_nonfinite(tensor: Tensor) -> str | None:
    """``[i, j, ...] = nan`` for the first NaN or Inf in ``tensor``; None when all finite."""
    bad = ~torch.isfinite(tensor)
    if not bad.any():
        return None
    index = tuple(int(i) for i in bad.nonzero()[0])
    return f"{list(index)} = {tensor[index].item()}"


def cosine(a: Tensor, b: Tensor) -> float:
    """Cosine similarity of two tensors seen as vectors: NaN when the shapes differ or either is
    non-finite; 1 when both are zero and 0 when only one is (a dead gradient points nowhere)."""
    if a.shape != b.shape:
        return float("nan")
    a, b = a.double().flatten(), b.double().flatten()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("nan")
    na, nb = a.norm().item(), b.norm().item()
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return (a @ b).item() / (na * nb)


def grad_stats(grad: Tensor | None) -> dict[str, float]:
    """Norm (NaN or Inf when any entry is), fraction of exact zeros, count of non-finite."""
    if grad is None:
        return dict(norm=float("nan"), zero_frac=float("nan"), nonfinite=float("nan"))
    finite = torch.isfinite(grad)
    return dict(
        norm=grad.norm().item(),
        zero_frac=(grad == 0).double().mean().item() if grad.numel() else float("nan"),
        nonfinite=float((~finite).sum().item()),
    )


def saturated_fraction(rows: Tensor) -> float:
    """Fraction of attention rows (last axis) whose largest weight is at least SATURATED."""
    return (rows.max(-1).values >= SATURATED).double().mean().item()


def degenerate(saturated: float) -> bool:
    """True when most attention rows are saturated: the projections barely learn."""
    return saturated >= DEGENERATE
