"""The model under diagnosis: a private copy in eval mode, how to call it, what it promises."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from harness.doctor.causality import registered_mask, stated
from harness.doctor.model.call import BATCH, SEQ_LEN, ModelCall, left_padded, state_of
from harness.metrics import rounding
from harness.runner import as_dtype

if TYPE_CHECKING:
    from harness.doctor.model.layers import Group

# Config attributes that say the model reads every token of its ids both ways, whatever its
# class can do: an encoder-decoder (the encoder sees all the ids), a causal flag turned off,
# XLNet-style bidirectional attention.
BIDIRECTIONAL = {"is_encoder_decoder": True, "causal": False, "is_causal": False, "attn_type": "bi"}


def layer_causal(layer: nn.Module) -> bool | None:
    """What an attention layer's flag says of itself, None when it says nothing."""
    flagged = stated(layer)
    return None if flagged is None else flagged.causal


def declared_causal(
    model: nn.Module, groups: list[Group], call: ModelCall
) -> tuple[bool, str] | None:
    """What the model is, and how that is known: causal when every group of attention layers,
    called as the model calls it, masks the future itself (its own triangle, read from one
    recorded call: what it computes outranks what anything says), or is handed a causal mask
    by it; else when every attention layer's flag says so (``is_causal``; an encoder's layers
    say otherwise); else not when its config says it reads both ways; else causal when it
    registers a causal mask (nanoGPT's ``bias`` in each layer, Whisper's decoder's additive
    ``mask``); else whether it can generate (transformers' ``can_generate()``, else a
    ``generate`` method); else whether its forward takes a cache or a start position, or it has
    a method that makes the cache it keeps (gpt-fast's ``setup_caches``, litgpt's
    ``set_kv_cache``): only a decoder does; None when nothing says (it is measured). A class's
    name says nothing."""
    own = [g.call.masks_future_itself() if g.call is not None else "" for g in groups]
    if own and all(own):
        return True, f"its attention layers mask the future themselves, at {own[0]}"
    handed = [g.call.causal_mask_given() if g.call is not None else "" for g in groups]
    if handed and all(handed):
        return True, f"it hands its attention layers a causal mask (`{handed[0]}`)"
    flags = [flag for flag in (stated(g.module) for g in groups) if flag is not None]
    if flags:
        causal = all(flag.causal for flag in flags)
        return causal, next(f"its attention layers' flags ({f.why})" for f in flags
                            if f.causal == causal)  # fmt: skip
    config = getattr(model, "config", None)
    for name, value in BIDIRECTIONAL.items():
        if getattr(config, name, None) == value:
            return False, f"its config sets {name} = {value}"
    buffer = registered_mask(model)
    if buffer is not None:
        return True, f"it registers a causal mask, `{buffer}`"
    can_generate = getattr(model, "can_generate", None)
    if callable(can_generate):
        return bool(can_generate()), f"can_generate() is {bool(can_generate())}"
    if callable(getattr(model, "generate", None)):
        return True, "it has a generate() method"
    if call.cache is not None or call.start is not None or call.makes_cache(model):
        return True, "it keeps a cache of past tokens"
    return None


def max_change(a: Tensor, b: Tensor) -> float:
    """The largest |a - b|; infinite where either is not finite."""
    return (a - b).abs().nan_to_num(float("inf")).max().item()


@dataclass
class Patient:
    """A copy of the model in ``dtype`` (float64 where it runs so: a probability that should not
    move does not move by rounding) and how to call it."""

    model: nn.Module
    call: ModelCall
    causal: bool
    seed: int
    dtype: torch.dtype
    # its buffers and tensor attributes as built, before any forward: a cache it keeps inside
    # as its first generation finds it (a forward fills it with the prompt it is then fed)
    built: dict[str, Tensor] = field(default_factory=dict)
    attends: bool = True  # attention layers were found in it (not a recurrence alone)

    @classmethod
    def of(cls, model: nn.Module, call: ModelCall, causal: bool, seed: int,
           built: dict[str, Tensor] | None = None) -> Patient:  # fmt: skip
        """float64, or float32 for a model that does not run in float64 or whose left-padded
        batch is not finite there (transformers' eager attention fills with float64's
        ``finfo.min``, then takes its softmax in float32, where that is -inf). ``built``: the
        model's state before any forward (``state_of``; default: as it is now)."""
        ids = call.tokens(BATCH, SEQ_LEN, seed)
        given = left_padded(call, ids, positions=False)
        for dtype in (torch.float64, torch.float32):
            copy = as_dtype(model, torch.device("cpu"), dtype).eval()
            built = state_of(copy) if built is None else built
            try:
                with torch.no_grad():
                    finite = bool(torch.isfinite(call.run(copy, ids, **given)).all())
            except Exception:
                if dtype == torch.float32:
                    raise
                continue
            if finite or dtype == torch.float32:
                return cls(copy, call, causal, seed, dtype, built)
        raise AssertionError("unreachable")

    def tokens(self, batch: int = BATCH, seq_len: int = SEQ_LEN, seed: int = 0) -> Tensor:
        return self.call.tokens(batch, seq_len, self.seed + seed)

    def logits(self, ids: Tensor, model: nn.Module | None = None, **given: Any) -> Tensor:
        """The logits (B, T, V) in float64, without gradients."""
        with torch.no_grad():
            return self.call.run(model or self.model, ids, **given).double()

    def floor(self, logits: Tensor) -> float:
        """How far rounding alone may move logits of this size: float32's rounding at least,
        since any part of a model may compute in float32 (a recurrence's scan, an upcast
        softmax) even in a float64 copy."""
        return rounding(logits.abs().max().item(), torch.float32)
