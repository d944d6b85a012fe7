"""Seeded inputs, masks and upstream gradients, drawn in float64 on the CPU.

Drawing on the CPU in float64 and only then moving and casting makes every device and dtype see
the same numbers for the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from harness.errors import UsageError, shorten
from harness.masks import keep_mask
from harness.shapes import Shape

# The seeds a user may give: 0 .. 2**32 - 1, as numpy's. torch takes up to 2**64 - 1, but seeds
# are offset and multiplied on the way (a step's batch is seed * 100_003 + step), which must
# stay within int64.
SEED_MAX = 2**32 - 1


def check_seed(seed: object) -> int:
    """``seed`` as an int, or a UsageError (one line) when it is not an integer in 0..SEED_MAX."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise UsageError(
            f"a seed is an integer from 0 to {SEED_MAX:,}, not {shorten(repr(seed), 30)}"
        )
    return seed


@dataclass(frozen=True)
class Inputs:
    """One draw: the input sequence and the mask the module should implement."""

    x: Tensor  # (B, T, d_model) float64, CPU
    keep: Tensor | None  # (B, T, T) bool, True = query may attend to key; None = no mask
    positions: Tensor | None = None  # (B, T) int64 positions to pass; None = the module's own


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)


def make_inputs(
    shape: Shape, seed: int, mask: str = "none", scale: float = 1.0, empty: bool = False
) -> Inputs:
    """Seeded inputs for one measurement: x ~ N(0, scale^2), and the mask of kind ``mask``."""
    gen = generator(seed)
    x = torch.randn(shape.batch, shape.seq_len, shape.d_model, generator=gen, dtype=torch.float64)
    keep = keep_mask(mask, shape.batch, shape.seq_len, gen, empty)
    return Inputs(x=x * scale, keep=keep)


def upstream_gradient(out_shape: torch.Size, seed: int) -> Tensor:
    """The seeded gradient G shared by every run: loss = sum(out * G)."""
    return torch.randn(out_shape, generator=generator(seed + 1_000_003), dtype=torch.float64)
