"""The tutorial's claims that no buggy/fixed pair measures, each measured by one small function
on the CPU in float32 from a seeded generator: what the scorecard quotes."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

SEEDS = range(10)  # the seeds a seed-dependent number is given over, as a range


def _randn(*shape: int, seed: int) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _error_of(run: Callable[[], object]) -> str:
    """The first line of what ``run()`` raises; "" when it runs."""
    try:
        run()
    except RuntimeError as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return ""


@dataclass(frozen=True)
class Spread:
    """§2: the standard deviation of q · k for unit-variance q and k of width d_k."""

    d_k: int
    unscaled: float
    scaled: float  # divided by sqrt(d_k)


def dot_product_spread(widths: tuple[int, ...] = (4, 64, 1024), pairs: int = 4096) -> list[Spread]:
    """q · k over ``pairs`` random pairs per width (seed 0): its spread grows as sqrt(d_k); the
    scale holds it near 1."""
    out = []
    for d_k in widths:
        q, k = _randn(pairs, d_k, seed=0), _randn(pairs, d_k, seed=1)
        dots = (q * k).sum(-1)  # (pairs,)
        out.append(Spread(d_k, dots.std().item(), (dots / math.sqrt(d_k)).std().item()))
    return out


@dataclass(frozen=True)
class Broadcast:
    """§3.3 and the module's docstring: a (B, 1, T, T) mask on (B, T, T) scores."""

    masked: tuple[int, ...]  # the scores' shape after masked_fill
    matmul_output: tuple[int, ...]  # (weights @ V)'s shape, where bmm would have raised
    bmm_error: str


@functools.cache
def mask_broadcast(batch: int = 2, seq_len: int = 3, d_v: int = 3) -> Broadcast:
    """Apply the documented 4-D keep-mask to 3-D scores, then finish with ``@`` and with bmm."""
    scores = _randn(batch, seq_len, seq_len, seed=0)  # (B, T, T)
    v = _randn(batch, seq_len, d_v, seed=1)  # (B, T, d_v)
    mask = torch.tril(torch.ones(batch, 1, seq_len, seq_len))  # (B, 1, T, T)
    weights = torch.softmax(scores.masked_fill(mask == 0, float("-inf")), dim=-1)
    return Broadcast(
        tuple(weights.shape), tuple((weights @ v).shape), _error_of(lambda: torch.bmm(weights, v))
    )


@dataclass(frozen=True)
class BatchContract:
    """§4.3: bmm's batch contract, as cross-attention meets it (queries and keys from two
    tensors whose batch sizes differ)."""

    bmm_error: str  # batch 2 of queries against batch 3 of keys
    matmul_shape: tuple[int, ...]  # batch 2 of queries against batch 1 of keys, with @


def batch_contract(seq_len: int = 4, d_k: int = 8) -> BatchContract:
    q = _randn(2, seq_len, d_k, seed=0)  # (2, T, d_k)
    k3, k1 = _randn(3, seq_len, d_k, seed=1), _randn(1, seq_len, d_k, seed=2)
    error = _error_of(lambda: torch.bmm(q, k3.transpose(1, 2)))
    return BatchContract(error, tuple((q @ k1.transpose(1, 2)).shape))


def head_parameters(d_model: int = 512, heads: int = 8) -> tuple[int, int]:
    """§5.1: the projection weights of ``heads`` heads of width d_model / heads (plus W_o), and
    of one head of width d_model (plus W_o): 4 d_model^2 both."""
    d_k = d_model // heads
    split = heads * 3 * d_model * d_k + d_model * d_model
    single = 3 * d_model * d_model + d_model * d_model
    return split, single


@dataclass(frozen=True)
class Unnormalised:
    """§6.3: exp(Q K^T / sqrt(d_k)) V without the softmax's division, over ``SEEDS``."""

    row_sum_min: float  # the smallest row sum of exp(scores) over the seeds (softmax's: 1)
    row_sum_max: float
    error_min: float  # the output's max abs error against softmax's, over its largest |value|
    error_max: float


def unnormalised_exp(seq_len: int = 128, d_k: int = 64) -> Unnormalised:
    """Unit-variance q, k, v of width d_k; each seed's exp-weighted output against softmax's."""
    sums, errors = [], []
    for seed in SEEDS:
        q, k, v = (_randn(seq_len, d_k, seed=3 * seed + i) for i in range(3))
        scores = q @ k.T / math.sqrt(d_k)  # (T, T)
        weights = torch.exp(scores)  # no normalisation
        reference = torch.softmax(scores, dim=-1) @ v  # (T, d_k)
        sums.append(weights.sum(-1))
        errors.append(((weights @ v - reference).abs().max() / reference.abs().max()).item())
    rows = torch.cat(sums)
    return Unnormalised(rows.min().item(), rows.max().item(), min(errors), max(errors))
