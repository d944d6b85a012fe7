"""Seeded inputs, masks and upstream gradients, drawn in float64 on the CPU.

Drawing on the CPU in float64 and only then moving and casting makes every device and dtype see
the same numbers for the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from harness.shapes import Shape


@dataclass(frozen=True)
class Inputs:
    """One draw: the input sequence and the mask the module should implement."""

    x: Tensor  # (B, T, d_model) float64, CPU
    keep: Tensor | None  # (B, T, T) bool, True = query may attend to key; None = no mask


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)


def causal_keep(batch: int, seq_len: int) -> Tensor:
    """(B, T, T) bool: query t may attend to keys 0..t."""
    tril = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()  # (T, T)
    return tril.expand(batch, seq_len, seq_len).clone()  # (B, T, T)


def padding_keep(batch: int, seq_len: int, gen: torch.Generator, empty: bool = False) -> Tensor:
    """(B, T, T) bool: every query may attend to the first L_b keys of sequence b.

    Each length is drawn from 1..T, so every row keeps at least one key; the first sequence is
    always full-length so the batch has both padded and unpadded rows. With ``empty`` the last
    sequence is all padding (length 0, needs batch >= 2): its queries have no key at all.
    """
    lengths = torch.randint(1, seq_len + 1, (batch,), generator=gen)  # (B,)
    if empty and batch > 1:
        lengths[-1] = 0
    lengths[0] = seq_len
    valid_key = torch.arange(seq_len) < lengths[:, None]  # (B, T)
    return valid_key[:, None, :].expand(batch, seq_len, seq_len).clone()  # (B, T, T)


def keep_mask(kind: str, shape: Shape, gen: torch.Generator, empty: bool = False) -> Tensor | None:
    """The keep-mask for a mask kind: none, causal, padding or both (``empty``: see padding)."""
    if kind == "none":
        return None
    if kind == "causal":
        return causal_keep(shape.batch, shape.seq_len)
    if kind == "padding":
        return padding_keep(shape.batch, shape.seq_len, gen, empty)
    if kind == "both":
        return causal_keep(shape.batch, shape.seq_len) & padding_keep(
            shape.batch, shape.seq_len, gen, empty
        )
    raise ValueError(f"unknown mask kind {kind!r}")


def make_inputs(
    shape: Shape, seed: int, mask: str = "none", scale: float = 1.0, empty: bool = False
) -> Inputs:
    """Seeded inputs for one measurement: x ~ N(0, scale^2), and the mask of kind ``mask``."""
    gen = generator(seed)
    x = torch.randn(shape.batch, shape.seq_len, shape.d_model, generator=gen, dtype=torch.float64)
    return Inputs(x=x * scale, keep=keep_mask(mask, shape, gen, empty))


def convert_mask(
    keep: Tensor | None, convention: str, device: torch.device, dtype: torch.dtype
) -> Tensor | None:
    """The keep-mask in the convention the module expects, on ``device``.

    keep: bool, True = attend. keep_float: 1.0 = attend, 0.0 = blocked, in ``dtype``. drop: bool,
    True = blocked. additive: 0 where allowed and -inf where blocked, in ``dtype``. key_padding:
    (B, T) bool, True = a real key (for padding masks, which block the same keys in every row).
    internal: the module masks by itself, so no mask is passed.
    """
    if keep is None or convention == "internal":
        return None
    keep = keep.to(device)
    if convention == "keep":
        return keep
    if convention == "keep_float":
        return keep.to(dtype)
    if convention == "key_padding":
        return keep.any(dim=1)  # (B, T): a key is real when some query may attend to it
    if convention == "drop":
        return ~keep
    if convention == "additive":
        zeros = torch.zeros(keep.shape, dtype=dtype, device=device)
        return zeros.masked_fill(~keep, float("-inf"))
    raise ValueError(f"unknown mask convention {convention!r}")


def upstream_gradient(out_shape: torch.Size, seed: int) -> Tensor:
    """The seeded gradient G shared by every run: loss = sum(out * G)."""
    return torch.randn(out_shape, generator=generator(seed + 1_000_003), dtype=torch.float64)
