"""Bugs injected into real architectures the way public bug reports describe them, each
through the model's own extension points (an attention function registered with transformers'
``AttentionInterface``, a hook on its rotary embedding), with the probe that must fail."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.doctor.target import Sizes, build
from harness.realmodules import (
    double_scale_attention,
    grouped_kv,
    sdpa_output,
    tiled_gqa_attention,
)


def unmasked_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                       attention_mask: Tensor | None, scaling: float, dropout: float = 0.0,
                       **kwargs: object) -> tuple[Tensor, None]:  # fmt: skip
    """The causal mask dropped: the mask never reaches SDPA and ``is_causal`` is left False
    (transformers issue 27050's kind: a refactor that stops passing the mask)."""
    key, value = grouped_kv(query, key, value)
    return sdpa_output(query, key, value, None, scaling)


def inverted_mask_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                            attention_mask: Tensor | None, scaling: float, dropout: float = 0.0,
                            **kwargs: object) -> tuple[Tensor, None]:  # fmt: skip
    """The additive mask handed to SDPA as ``mask < 0``, a bool mask that SDPA reads as the
    keys to keep: the blocked ones are kept and the kept ones blocked (PyTorch issue 92554's
    kind, a bool mask of the other convention)."""
    key, value = grouped_kv(query, key, value)
    mask = None if attention_mask is None else attention_mask < 0
    if mask is not None:
        mask = mask | ~mask.any(dim=-1, keepdim=True)  # a row with no key at all: every key
    return sdpa_output(query, key, value, mask, scaling)


def softcap_after_mask_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                                 attention_mask: Tensor | None, scaling: float,
                                 dropout: float = 0.0, softcap: float | None = None,
                                 **kwargs: object) -> tuple[Tensor, None]:  # fmt: skip
    """Gemma 2's score cap applied after the mask is added: cap * tanh(-big / cap) is -cap,
    finite, so a masked key keeps weight exp(-2 cap) relative (transformers PR 31698's kind)."""
    key, value = grouped_kv(query, key, value)
    scores = query @ key.transpose(-2, -1) * scaling  # (B, h, T, S)
    if attention_mask is not None:
        scores = scores + attention_mask
    cap = softcap or 50.0
    scores = cap * torch.tanh(scores / cap)
    out = F.softmax(scores.float(), dim=-1).to(query.dtype) @ value
    return out.transpose(1, 2).contiguous(), None


def current_token_dropped_attention(module: nn.Module, query: Tensor, key: Tensor,
                                    value: Tensor, attention_mask: Tensor | None,
                                    scaling: float, dropout: float = 0.0,
                                    **kwargs: object) -> tuple[Tensor, None]:  # fmt: skip
    """A cached step that reads the cache before the new keys are in it: with fewer queries
    than keys, the keys and values of the tokens being fed are left out."""
    key, value = grouped_kv(query, key, value)
    new, total = query.shape[-2], key.shape[-2]
    if new < total:
        key, value = key[:, :, : total - new], value[:, :, : total - new]
        if attention_mask is not None:
            attention_mask = attention_mask[..., : total - new]
    return sdpa_output(query, key, value, attention_mask, scaling)


def restart_positions(model: nn.Module) -> None:
    """Default positions that restart at 0 on each cached call: when the caller passes no
    position ids and a cache, the model numbers the new tokens 0..T-1 instead of after the
    cache (transformers issues 25420 and 29149's kind)."""

    def restart(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        cached = any(kwargs.get(name) is not None for name in ("cache", "past_key_values"))
        ids = kwargs.get("input_ids", args[0] if args else None)
        if cached and kwargs.get("position_ids") is None and ids is not None:
            kwargs = {**kwargs, "position_ids": torch.arange(ids.shape[1]).expand_as(ids)}
        return args, kwargs

    model.register_forward_pre_hook(restart, with_kwargs=True)


def small_cap(model: nn.Module) -> None:
    """A score cap of 2 on every attention layer (Gemma 2's is 50), so that a masked key capped
    after the mask keeps weight at ordinary activations, and Gemma 2 27B's scale, which is not
    1/sqrt(d): query_pre_attn_scalar 144 for heads of 128."""
    for module in model.modules():
        if getattr(module, "attn_logit_softcapping", None):
            module.attn_logit_softcapping = 2.0
            module.scaling = (module.head_dim * 144 / 128) ** -0.5


ATTENTION = {
    "doctor_unmasked": unmasked_attention,
    "doctor_tiled_gqa": tiled_gqa_attention,
    "doctor_double_scale": double_scale_attention,
    "doctor_inverted_mask": inverted_mask_attention,
    "doctor_softcap_after_mask": softcap_after_mask_attention,
    "doctor_current_token_dropped": current_token_dropped_attention,
}


@dataclass(frozen=True)
class Bug:
    """One injected bug: the architecture, how it is injected, the probe that must fail and the
    catalogue trap that must be named."""

    id: str
    class_name: str
    probe: str
    trap: str
    attention: str | None = None  # a function of ATTENTION, as the model's implementation
    patch: Callable[[nn.Module], None] | None = None

    def build(self, seed: int = 0, layers: int = 2) -> nn.Module:
        transformers = importlib.import_module("transformers")
        for name, function in ATTENTION.items():  # each with eager's full additive masks
            transformers.AttentionInterface.register(name, function)
            masks = importlib.import_module("transformers.masking_utils")
            transformers.AttentionMaskInterface.register(name, masks.eager_mask)
        model = build(getattr(transformers, self.class_name), Sizes(layers=layers), seed)
        if self.attention is not None:
            model.set_attn_implementation(self.attention)
        if self.patch is not None:
            self.patch(model)
        return model


BUGS = [
    Bug("llama-causal-mask-dropped", "LlamaForCausalLM", "causal no-leak", "causal_leak",
        "doctor_unmasked"),
    Bug("qwen2-causal-mask-dropped", "Qwen2ForCausalLM", "causal no-leak", "causal_leak",
        "doctor_unmasked"),
    Bug("llama-kv-heads-tiled", "LlamaForCausalLM", "backends agree", "gqa_kv_grouping",
        "doctor_tiled_gqa"),
    Bug("mistral-kv-heads-tiled", "MistralForCausalLM", "backends agree", "gqa_kv_grouping",
        "doctor_tiled_gqa"),
    Bug("llama-scale-twice", "LlamaForCausalLM", "agrees with SDPA", "double_scale",
        "doctor_double_scale"),
    Bug("qwen3-scale-twice", "Qwen3ForCausalLM", "agrees with SDPA", "double_scale",
        "doctor_double_scale"),
    Bug("gemma2-softcap-after-mask", "Gemma2ForCausalLM", "causal no-leak", "softcap_after_mask",
        "doctor_softcap_after_mask"),
    Bug("gemma2-small-cap-softcap-after-mask", "Gemma2ForCausalLM", "agrees with SDPA",
        "softcap_after_mask", "doctor_softcap_after_mask", small_cap),
    Bug("llama-inverted-padding-mask", "LlamaForCausalLM", "left padding", "sdpa_mask_inverted",
        "doctor_inverted_mask"),
    Bug("gpt2-inverted-padding-mask", "GPT2LMHeadModel", "left padding", "sdpa_mask_inverted",
        "doctor_inverted_mask"),
    Bug("llama-positions-restart-under-cache", "LlamaForCausalLM", "cached generation",
        "rope_cache_offset", patch=restart_positions),
    Bug("qwen2-positions-restart-under-cache", "Qwen2ForCausalLM", "cached generation",
        "rope_cache_offset", patch=restart_positions),
    Bug("llama-cache-drops-current-token", "LlamaForCausalLM", "cached generation",
        "stale_cache", "doctor_current_token_dropped"),
    Bug("phi3-cache-drops-current-token", "Phi3ForCausalLM", "cached generation", "stale_cache",
        "doctor_current_token_dropped"),
]  # fmt: skip
