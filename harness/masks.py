"""One mask vocabulary for both wings: which keys a query may see, and how a module wants it.

Every mask starts as a *keep-mask*: ``(B, T, T)`` bool, True = the query may attend to the key.
A ``MaskSpec`` says how a module takes it: its meaning (keep: True/1 attends; drop: True/1 is
blocked, as ``nn.MultiheadAttention``; additive: 0 where allowed and -inf where blocked, added to
the scores), its layout (``bqk`` (B, T, T); ``b1qk`` (B, 1, T, T); ``bk`` key padding (B, T);
``b11k`` key padding (B, 1, 1, T), BERT's extended mask; ``qk`` (T, T), one mask for every
sequence, as Whisper's ``mask[:T, :T]`` and ``nn.MultiheadAttention``'s ``attn_mask``) and, for
keep/drop masks, its dtype (bool, or float 0/1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

KINDS = ("none", "causal", "padding", "both", "left_padding")  # which keys are blocked
CAUSAL_KINDS = ("causal", "both", "left_padding")  # the kinds that block the future
MEANINGS = ("keep", "drop", "additive")
LAYOUTS = ("bqk", "b1qk", "bk", "b11k", "qk")
KEY_LAYOUTS = ("bk", "b11k")  # which keys are padding, per sequence: never the future
SHARED_LAYOUTS = ("qk",)  # one mask for the whole batch: the future, never a sequence's padding
MASK_DTYPES = ("bool", "float")
FILLS = ("-inf", "min")


def lowest(dtype: torch.dtype) -> float:
    """The fill of an additive mask as a model in ``dtype`` builds it (``finfo.min``), at most
    float32's: a float64 probe of a module that upcasts its scores to float32 for the softmax
    (transformers' eager attention) would otherwise pass -inf there, which no float32 model
    does, and see NaN on a row with no key."""
    return max(torch.finfo(dtype).min, torch.finfo(torch.float32).min)


@dataclass(frozen=True)
class MaskSpec:
    """How one module takes its mask."""

    meaning: str = "keep"  # one of MEANINGS
    layout: str = "bqk"  # one of LAYOUTS
    dtype: str = "bool"  # one of MASK_DTYPES (additive masks are always in the compute dtype)
    # what an additive mask adds where blocked: -inf (the catalogue's), or the dtype's most
    # negative finite value, as transformers builds its masks (a row with no key then stays
    # finite, so a NaN there is the module's own)
    fill: str = "-inf"

    def __post_init__(self) -> None:
        for name, allowed in (("meaning", MEANINGS), ("layout", LAYOUTS), ("dtype", MASK_DTYPES),
                              ("fill", FILLS)):  # fmt: skip
            if getattr(self, name) not in allowed:
                raise ValueError(f"mask {name} {getattr(self, name)!r} not in {allowed}")

    def encode(self, keep: Tensor, device: torch.device, dtype: torch.dtype) -> Tensor:
        """The (B, T, T) keep-mask in this convention and layout, on ``device``."""
        if self.layout in KEY_LAYOUTS:
            keep = keep.any(dim=1)  # (B, T): a key is real when some query may attend to it
        elif self.layout in SHARED_LAYOUTS:
            if not bool((keep == keep[:1]).all()):
                raise ValueError(
                    "a (T, T) mask is one for every sequence: it cannot hold each one's padding"
                )
            keep = keep[0]  # (T, T)
        if self.meaning == "additive":
            blocked = float("-inf") if self.fill == "-inf" else lowest(dtype)
            mask = torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, blocked)
        else:
            mask = keep if self.meaning == "keep" else ~keep
            mask = mask.to(dtype) if self.dtype == "float" else mask
        if self.layout == "b1qk":
            mask = mask[:, None]  # (B, 1, T, T): one mask for every head
        elif self.layout == "b11k":
            mask = mask[:, None, None, :]  # (B, 1, 1, T): for every head and every query
        return mask.to(device)


# The catalogue's conventions by name; "internal": the module builds its own mask and is called
# without one.
CONVENTIONS: dict[str, MaskSpec | None] = {
    "keep": MaskSpec("keep"),
    "keep_float": MaskSpec("keep", dtype="float"),
    "drop": MaskSpec("drop"),
    "additive": MaskSpec("additive"),
    "key_padding": MaskSpec("keep", layout="bk"),
    "internal": None,
}


def encode(
    keep: Tensor | None, spec: MaskSpec | None, device: torch.device, dtype: torch.dtype
) -> Tensor | None:
    """``keep`` as ``spec`` wants it, or None when there is no mask or the module takes none."""
    if keep is None or spec is None:
        return None
    return spec.encode(keep, device, dtype)


def causal_keep(batch: int, seq_len: int) -> Tensor:
    """(B, T, T) bool: query t may attend to keys 0..t."""
    tril = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()  # (T, T)
    return tril.expand(batch, seq_len, seq_len).clone()  # (B, T, T)


def live_queries(allowed: Tensor | None, batch: int, seq_len: int) -> Tensor:
    """(B, T) queries whose output means something under the (B, T, T) keep-mask ``allowed``:
    they have a key, and (key padding) are not padding themselves, whose outputs some modules
    zero."""
    live = torch.ones(batch, seq_len, dtype=torch.bool)
    if allowed is not None:
        live &= allowed.any(-1) & allowed.any(-2)  # a query with a key, and itself a key somewhere
    return live


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


def left_padding_keep(batch: int, seq_len: int, gen: torch.Generator) -> Tensor:
    """(B, T, T) bool: causal, and sequence b starts after P_b padding keys on the left.

    P_b is drawn from 1..T-1 (the first sequence has none), as a batch is padded for generation;
    a padding query sees no key at all.
    """
    pads = torch.randint(1, max(seq_len, 2), (batch,), generator=gen).clamp(max=seq_len - 1)
    pads[0] = 0
    valid_key = torch.arange(seq_len) >= pads[:, None]  # (B, T)
    return causal_keep(batch, seq_len) & valid_key[:, None, :] & valid_key[:, :, None]


def keep_mask(
    kind: str, batch: int, seq_len: int, gen: torch.Generator, empty: bool = False
) -> Tensor | None:
    """The keep-mask of a kind: none, causal, padding or both (``empty``: see padding_keep)."""
    if kind == "none":
        return None
    if kind == "causal":
        return causal_keep(batch, seq_len)
    if kind == "padding":
        return padding_keep(batch, seq_len, gen, empty)
    if kind == "both":
        return causal_keep(batch, seq_len) & padding_keep(batch, seq_len, gen, empty)
    if kind == "left_padding":
        return left_padding_keep(batch, seq_len, gen)
    raise ValueError(f"unknown mask kind {kind!r}")
