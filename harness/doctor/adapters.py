"""Call adapters for libraries whose attention layers the caller feeds (``--call``).

An adapter is ``fn(module, x, *, positions, mask, cache)``: it calls the layer the way the
library's own model does. Its ``make_cache()``, when it has one, makes an empty cache for the
generation probes. Use one as ``--call harness.doctor.adapters:transformers``.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from harness.errors import UsageError
from harness.masks import lowest
from harness.reference import int_attribute

CACHE_WORDS = ("cache", "past")  # cache, past_key_value(s), layer_past: by version and model


def _rotary_embedding(module: nn.Module) -> nn.Module:
    """The model's own rotary embedding for this layer: the ``...RotaryEmbedding`` class of the
    layer's modeling file (or, for a subclass written elsewhere, of its nearest base's), built
    from the layer's config (as the model builds it)."""
    found = [v for cls in type(module).__mro__
             for n, v in vars(sys.modules.get(cls.__module__, object)).items()
             if n.endswith("RotaryEmbedding") and isinstance(v, type)]  # fmt: skip
    if not found:
        raise UsageError(
            f"--call ...adapters:transformers: no ...RotaryEmbedding class in "
            f"{type(module).__module__}, beside {type(module).__name__}: import the model's "
            "rotary embedding class there, or write an adapter"
        )
    return found[0](config=module.config)


def _rotary_tables(rotary: nn.Module, module: nn.Module, x: Tensor, positions: Tensor) -> object:
    """The rotary embedding's (cos, sin) at ``positions``, called as the model calls it: any
    further parameter of its forward (Gemma3's ``layer_type``) is the layer's attribute of that
    name."""
    params = list(inspect.signature(rotary.forward).parameters.values())[2:]  # after x, positions
    extra = {p.name: getattr(module, p.name) for p in params
             if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
             and hasattr(module, p.name)}  # fmt: skip
    return rotary(x, positions, **extra)


def _optional_inputs(
    module: nn.Module, params: Mapping[str, inspect.Parameter], given: Mapping[str, object]
) -> dict[str, object]:
    """None for the other required parameters that may be None (Falcon's ``alibi`` when its
    model uses rotary instead); UsageError naming one that may not (MPT's ``position_bias``,
    the ALiBi bias its model builds), rather than every probe raising the same TypeError."""
    filled: dict[str, object] = {}
    for name, p in list(params.items())[1:]:  # after the hidden states
        if p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name in given or any(word in name.lower() for word in CACHE_WORDS):
            continue
        if "None" not in str(p.annotation):
            raise UsageError(
                f"{type(module).__name__}.forward needs `{name}`, which its model builds and "
                "--call ...adapters:transformers cannot: write an adapter that passes it"
            )
        filled[name] = None
    return filled


def _cache_parameter(module: nn.Module) -> str | None:
    """The forward parameter that takes the cache: the one annotated as a ``Cache``, else the
    first whose name says cache or past (``past_key_values``, GPT-NeoX's ``layer_past``)."""
    params = inspect.signature(module.forward).parameters
    typed = [n for n, p in params.items() if "Cache" in str(p.annotation)]
    named = [n for n in params if any(word in n.lower() for word in CACHE_WORDS)]
    return next(iter(typed + named), None)


def _with_window(module: nn.Module, mask: Tensor | None) -> Tensor | None:
    """The layer's sliding window (``sliding_window``, its own or its config's, as Mistral's and
    Gemma's sliding layers) added to an additive
    (B, 1, T, S) mask, as the model's own mask builder adds it: the i-th of T new tokens is
    token S - T + i, and key s is blocked for it when it is ``window`` or more tokens back."""
    window = int_attribute(module, ("sliding_window",))  # the layer's own beats its config's
    if not window or mask is None or not mask.is_floating_point() or mask.dim() != 4:
        return mask
    T, S = mask.shape[-2:]
    queries = torch.arange(S - T, S, device=mask.device)  # (T,) token indices of the new ones
    far = queries[:, None] - torch.arange(S, device=mask.device) >= window  # (T, S)
    return mask.masked_fill(far, lowest(mask.dtype))


def transformers(
    module: nn.Module, x: Tensor, *, positions: Tensor, mask: Tensor | None, cache: object
) -> object:
    """A transformers decoder attention layer (Llama, Mistral, Qwen2, Gemma, ...): (cos, sin)
    from the model's rotary embedding at ``positions`` when its forward takes
    ``position_embeddings`` (OPT's does not), ``mask`` as its ``attention_mask`` (the model
    builds it: declare --mask additive --mask-shape b1qk) and ``cache`` as its cache."""
    params = inspect.signature(module.forward).parameters
    kwargs: dict[str, object] = {"attention_mask": _with_window(module, mask)}
    if "position_embeddings" in params:  # rotary layers
        rotary = _rotary_embedding(module).to(x.device)
        kwargs["position_embeddings"] = _rotary_tables(rotary, module, x, positions.to(x.device))
    kwargs.update(_optional_inputs(module, params, kwargs))
    if cache is not None:
        name = _cache_parameter(module)
        if name is None:
            raise UsageError(
                f"{type(module).__name__}.forward takes no cache parameter (annotated Cache, or "
                "named ...cache... / ...past...): no cache to probe through this adapter"
            )
        kwargs[name] = cache
    return module(x, **kwargs)


def make_cache() -> object:
    """An empty ``transformers.DynamicCache``, updated in place by the layer."""
    from transformers import DynamicCache

    return DynamicCache()


transformers.make_cache = make_cache  # type: ignore[attr-defined]
transformers.kv_grouping = "blocks"  # type: ignore[attr-defined]  # repeat_kv: blocks


class XCache:
    """x-transformers' cache for one layer: the intermediates its last call returned."""

    def __init__(self) -> None:
        self.value: object = None

    def reset(self) -> None:
        self.value = None

    def __len__(self) -> int:
        cached = None if self.value is None else getattr(self.value, "cached_kv", None)
        return 0 if cached is None else cached[0].shape[-2]


def x_transformers(
    module: nn.Module, x: Tensor, *, positions: Tensor, mask: Tensor | None, cache: object
) -> object:
    """An ``x_transformers.Attention`` as its ``AttentionLayers`` calls it with rotary: the
    rotary table from its ``RotaryEmbedding`` for every key (it rotates the cached keys again
    at each call), ``mask`` as its key padding ``mask``, and ``return_intermediates`` giving
    the cache back."""
    from x_transformers.x_transformers import RotaryEmbedding

    dim_head = module.to_q.out_features // module.heads
    past = 0 if cache is None else len(cache)
    first = positions[0].to(x.device)  # (T,) one row's positions: rotary tables are per batch
    keys = torch.cat([torch.arange(past, device=x.device), first]) if past else first
    freqs, scale = RotaryEmbedding(dim_head).to(x.device)(keys)
    kwargs: dict[str, object] = {"rotary_pos_emb": (freqs, scale), "mask": mask}
    if cache is None:
        return module(x, **kwargs)
    out, cache.value = module(x, cache=cache.value, return_intermediates=True, **kwargs)
    return out


x_transformers.make_cache = XCache  # type: ignore[attr-defined]
x_transformers.kv_grouping = "strided"  # type: ignore[attr-defined]  # it tiles with (r h)
