"""The model under diagnosis: a private copy in eval mode, how to call it, what it promises."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from harness.doctor.model.call import ModelCall
from harness.metrics import rounding
from harness.runner import as_dtype

BATCH, SEQ_LEN = 2, 8  # the model probes' batch; B != T, so that neither passes for the other


def declared_causal(model: nn.Module, layers: list[nn.Module]) -> bool | None:
    """What the model says it is: its attention layers' ``is_causal``, else whether it can
    generate (transformers' ``can_generate()``, else a ``generate`` method), else a causal LM by
    its class name (``...ForCausalLM``, ``...LMHeadModel``); None when nothing says."""
    flags = [layer.is_causal for layer in layers if isinstance(getattr(layer, "is_causal", None),
                                                                bool)]  # fmt: skip
    if flags:
        return any(flags)
    can_generate = getattr(model, "can_generate", None)
    if callable(can_generate):
        return bool(can_generate())
    if callable(getattr(model, "generate", None)):
        return True
    name = type(model).__name__
    return True if "CausalLM" in name or "LMHead" in name else None


@dataclass
class Patient:
    """A copy of the model in ``dtype`` (float64 where it runs so: a probability that should not
    move does not move by rounding) and how to call it."""

    model: nn.Module
    call: ModelCall
    causal: bool
    seed: int
    dtype: torch.dtype

    @classmethod
    def of(cls, model: nn.Module, call: ModelCall, causal: bool, seed: int) -> Patient:
        """float64, or float32 for a model that does not run in float64 or whose left-padded
        batch is not finite there (transformers' eager attention fills with float64's
        ``finfo.min``, then takes its softmax in float32, where that is -inf)."""
        ids = call.tokens(BATCH, SEQ_LEN, seed)
        given = {}
        if call.mask is not None:
            mask = torch.ones_like(ids)
            mask[0, :3] = 0
            given["mask"] = mask
        for dtype in (torch.float64, torch.float32):
            copy = as_dtype(model, torch.device("cpu"), dtype).eval()
            try:
                with torch.no_grad():
                    finite = bool(torch.isfinite(call.run(copy, ids, **given)).all())
            except Exception:
                if dtype == torch.float32:
                    raise
                continue
            if finite or dtype == torch.float32:
                return cls(copy, call, causal, seed, dtype)
        raise AssertionError("unreachable")

    def tokens(self, batch: int = BATCH, seq_len: int = SEQ_LEN, seed: int = 0) -> Tensor:
        return self.call.tokens(batch, seq_len, self.seed + seed)

    def logits(self, ids: Tensor, model: nn.Module | None = None, **given: Any) -> Tensor:
        """The logits (B, T, V) in float64, without gradients."""
        with torch.no_grad():
            return self.call.run(model or self.model, ids, **given).double()

    def floor(self, logits: Tensor) -> float:
        """How far rounding alone may move logits of this size in the copy's dtype."""
        return rounding(logits.abs().max().item(), self.dtype)
