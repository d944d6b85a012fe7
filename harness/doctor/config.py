"""How to call the module under diagnosis and what it promises (``Config``: one field per option of
the doctor's table), and the seeding every step of the doctor runs under."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from harness.doctor.options import BY_NAME
from harness.errors import UsageError, shorten
from harness.masks import (
    MaskSpec,
)
from harness.metrics import rounding
from harness.runner import seeded


@contextmanager
def quietly_seeded(seed: int) -> Iterator[None]:
    """A block that starts from the seeded RNG (restored afterwards), with warnings silenced: a
    module that samples gives the same evidence whatever ran before; warnings are not findings."""
    with seeded(seed), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# The largest (B, T, T) score matrix the doctor makes (512 MiB per head in float64): a size past
# it is refused up front instead of failing every probe with an allocation error.
MAX_SCORES = 4 * 4096**2


# --rope-pairing: how the checkpoint's weights pair rotary dimensions, by the name of the
# reference's rotary style: i with i + d/2 (transformers' rotate_half, NeoX) or 2i with 2i + 1
# (GPT-J, Meta's complex form). Both are valid rotations; only the weights tell which is right.
ROTARY_STYLE = {"half": "half", "interleaved": "pairs"}


def float32_rounding(scale: float) -> float:
    """How far reordered float32 sums may move outputs of size ``scale`` (a module may compute
    anything in float32): ``metrics.rounding``."""
    return rounding(scale, torch.float32)


def option(name: str) -> Any:
    """A ``Config`` field whose default and meaning are the options table's (``OPTIONS``)."""
    return field(default=BY_NAME[name].default, metadata={"option": BY_NAME[name]})


@dataclass(frozen=True)
class Config:
    """How to call the module and what it promises: one field per option of ``OPTIONS`` (what
    each value means is written there, and in ``--help``)."""

    mask: str = option("mask")
    causal: bool = option("causal")
    mask_shape: str = option("mask_shape")
    mask_dtype: str = option("mask_dtype")
    positions: str = option("positions")
    kv_heads: int | None = option("kv_heads")
    window: int | None = option("window")
    rope_pairing: str = option("rope_pairing")
    rotary_dims: int | None = option("rotary_dims")
    rope_base: float | None = option("rope_base")
    packed: bool = option("packed")
    kv_grouping: str = option("kv_grouping")
    # A call adapter, fn(module, x, *, positions, mask, cache), calling the module the way the
    # user's model does (--call file.py:fn); its ``make_cache()``, if any, makes an empty cache.
    call: Callable[..., object] | None = field(
        default=None, repr=False, metadata={"option": BY_NAME["call"]}
    )
    dtype: str = option("dtype")
    strict: bool = option("strict")
    batch: int = option("batch")
    seq_len: int = option("seq_len")
    sequence_first: bool = option("sequence_first")
    mask_arg: str | None = option("mask_arg")
    d_model: int | None = field(default=None, metadata={"option": BY_NAME["d_model"]})
    device: str = option("device")
    seed: int = option("seed")
    scale: float | None = option("scale")
    softcap: float | None = option("softcap")

    def __post_init__(self) -> None:
        for f in fields(self):
            known = f.metadata.get("option")
            if known is not None and known.choices and getattr(self, f.name) not in known.choices:
                raise UsageError(
                    f"{known.flag} must be one of {', '.join(known.choices)}, not "
                    f"{shorten(repr(getattr(self, f.name)), 30)}"
                )
        if self.batch < 2 or self.seq_len < 3:
            raise UsageError("the doctor needs --batch >= 2 and --seq-len >= 3")
        if self.batch * self.seq_len**2 > MAX_SCORES:
            raise UsageError(
                f"--batch {self.batch} --seq-len {self.seq_len}: one head's (B, T, T) scores "
                f"would hold {self.batch * self.seq_len**2:.3g} values, more than the doctor "
                f"probes ({MAX_SCORES:,}: --seq-len 4096 with --batch 4); a leak or a wrong "
                "mask shows on short sequences"
            )
        if self.scale is not None and not (
            isinstance(self.scale, int | float) and 0 < self.scale < math.inf
        ):
            raise UsageError(f"--scale must be a positive number or none, not {self.scale!r}")
        if self.softcap is not None and not 0 < self.softcap < math.inf:
            raise UsageError(f"--softcap must be a positive number, not {self.softcap!r}")
        if self.kv_heads is not None and self.kv_heads < 1:
            raise UsageError("--kv-heads must be a positive number of K/V heads")
        if self.window is not None and self.window < 1:
            raise UsageError("--window must be a positive number of keys")
        if self.rope_base is not None and not 1 < self.rope_base < math.inf:
            raise UsageError(f"--rope-base must be a number above 1, not {self.rope_base!r}")
        if self.rotary_dims is not None and (self.rotary_dims < 2 or self.rotary_dims % 2):
            raise UsageError("--rotary-dims must be a positive even number of dimensions")

    @property
    def spec(self) -> MaskSpec | None:
        """The module's mask convention in the shared vocabulary; None when it takes no mask."""
        if self.mask in ("auto", "none"):  # detected (harness.doctor.convention), or none
            return None
        # an additive mask as real callers build it: finfo.min, so an all-padding row stays
        # finite unless the module itself makes it NaN
        return MaskSpec(self.mask, self.mask_shape, self.mask_dtype, fill="min")

    @classmethod
    def for_spec(cls, spec: MaskSpec | None, **options: object) -> Config:
        """The options for a module that takes its mask as ``spec`` (None: no mask)."""
        if spec is None:
            return cls(**options)
        return cls(mask=spec.meaning, mask_shape=spec.layout, mask_dtype=spec.dtype, **options)
