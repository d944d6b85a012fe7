"""What a module states about itself in its attributes and its code: widths, context, head width, a
sliding window, partial rotary, the rotary base, the names its class's code uses."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from torch import Tensor, nn

from harness.reference import (
    HEAD_DIM_ATTRS,
    ROPE_BASE,
    head_count,
    int_attribute,
    is_mask,
    positive_attribute,
)

if TYPE_CHECKING:
    from harness.doctor.config import Config


def width_candidates(module: nn.Module, given: int | None = None) -> list[int]:
    """Input widths the module may take, most likely first: a width attribute, the given one,
    the first Linear's input, then both sides of each 2-D parameter (``x @ W`` code stores W
    as (in, out), nn.Linear as (out, in))."""
    found: list[int] = []
    if isinstance(getattr(module, "mha", None), nn.MultiheadAttention):
        found.append(module.mha.embed_dim)
    for name in ("embed_dim", "d_model", "dim", "n_embd", "hidden_size", "n_state"):
        value = getattr(module, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            found.append(value)
    if given is not None:
        found.append(given)
    found += [m.in_features for m in module.modules() if isinstance(m, nn.Linear)][:1]
    for param in module.parameters():
        if param.dim() == 2:
            found += [param.shape[1], param.shape[0]]
    return list(dict.fromkeys(found))


CONTEXT_NAMES = ("block_size", "max_seq_len", "n_ctx", "context_length", "max_position_embeddings",
                 "max_seq_length", "n_positions", "max_len", "context_size")  # fmt: skip


# A table of absolute positions (nanoGPT's wpe, pos_emb, position_embeddings): its rows are the
# positions a model can take; a relative bias's rows are buckets (T5's relative_attention_bias).
ABSOLUTE_TABLE = re.compile(r"\bwpe\b|pos", re.IGNORECASE)


RELATIVE_TABLE = re.compile(r"relative|\brel_|bias", re.IGNORECASE)


def declared_context(module: nn.Module) -> int | None:
    """The longest sequence the module says it takes, what the module itself says first: its
    own attribute; else what it registers, a square mask buffer of N x N (nanoGPT's causal
    ``bias`` of block_size rows; the shortest if several); else its config's; else the rows of
    its table of absolute positions (an OPT-like model's ``wpe`` made for block_size); else
    None."""
    stated = int_attribute(module, CONTEXT_NAMES, include_config=False)
    if stated is not None:
        return stated
    sizes = [
        b.shape[-1] for b in module.buffers()
        if b.dim() >= 2 and b.shape[-1] == b.shape[-2] > 1 and is_mask(b)
    ]  # fmt: skip
    if sizes:
        return min(sizes)
    configured = int_attribute(module, CONTEXT_NAMES)
    if configured is not None:
        return configured
    tables = [
        m.num_embeddings for name, m in module.named_modules()
        if isinstance(m, nn.Embedding) and ABSOLUTE_TABLE.search(name)
        and not RELATIVE_TABLE.search(name)
    ]  # fmt: skip
    return min(tables) if tables else None


WINDOW_NAMES = ("sliding_window", "window_size", "window", "attention_window",
                "local_window_size", "window_len")  # fmt: skip


def window_of(module: nn.Module, config: Config) -> tuple[int | None, str]:
    """(the sliding window in keys, how it is known), or (None, why there is none)."""
    if config.window is not None:
        return config.window, "declared (--window)"
    found = int_attribute(module, WINDOW_NAMES)
    if found is not None:
        return found, "read off the module"
    return None, "no window declared (--window) or found on the module"


def head_width(module: nn.Module) -> int:
    """The module's per-head width: an attribute (or its config's) under a common name, else the
    width of its first Linear's output over its head count; 64 when nothing says."""
    head_dim = int_attribute(module, HEAD_DIM_ATTRS)
    if head_dim is not None:
        return head_dim
    linear = next((m for m in module.modules() if isinstance(m, nn.Linear)), None)
    return linear.out_features // head_count(module) if linear is not None else 64


SOFTCAP_NAMES = ("attn_logit_softcapping", "softcap", "logit_softcapping", "logits_soft_cap")


ROTARY_DIM_ATTRS = ("rotary_ndims", "rotary_dim", "rotary_dims", "rot_dim", "rotary_emb_dim",
                    "rope_n_elem")  # fmt: skip  # litgpt's config


ROTARY_FACTORS = ("partial_rotary_factor", "rotary_pct", "rotary_percentage")


def rotary_dims(module: nn.Module, declared: int | None = None) -> int | None:
    """How many dimensions of each head its rotation turns, when fewer than all (partial
    rotary): ``declared`` (--rotary-dims), else the module's own attribute or its config's
    (litgpt's ``rope_n_elem``), else its config's fraction of the head width
    (``partial_rotary_factor``, which transformers keeps in ``rope_parameters``, ``rotary_pct``,
    litgpt's ``rotary_percentage``); None: the whole head. A config with ``rope_parameters``
    is read for its fraction only: MiniMax-M3 keeps a ``rotary_dim`` its rotary never reads."""
    config = getattr(module, "config", None)
    rope = getattr(config, "rope_parameters", None)
    modern = isinstance(rope, Mapping)  # transformers' rotary reads rope_parameters, not ints
    found = declared or int_attribute(module, ROTARY_DIM_ATTRS, include_config=not modern)
    factors = [rope.get(n) for n in ROTARY_FACTORS] if modern else []
    factors += [getattr(config, n, None) for n in ROTARY_FACTORS]
    factor = next((f for f in factors if f is not None), None)
    if found is None and isinstance(factor, int | float) and 0 < factor < 1:
        found = int(head_width(module) * factor)
    return found if found is not None and found < head_width(module) else None


ROPE_BASES = ("rope_theta", "rotary_emb_base", "rotary_base", "rope_base", "rotary_theta")


def rope_base(module: nn.Module, declared: float | None = None) -> float:
    """Its rotary base: ``declared`` (--rope-base), else the module's own attribute or its
    config's (``rope_theta``, or in transformers' ``rope_parameters``), else its rotary
    embedding's ``base``, else RoPE's 10000."""
    found = declared or positive_attribute(module, ROPE_BASES, real=True)
    rope = getattr(getattr(module, "config", None), "rope_parameters", None)
    if found is None and isinstance(rope, Mapping):
        theta = rope.get("rope_theta")
        found = float(theta) if isinstance(theta, int | float) and theta > 1 else None
    for child in module.modules() if found is None else ():
        if "rotary" in type(child).__name__.lower() or "rope" in type(child).__name__.lower():
            found = positive_attribute(child, ("base", *ROPE_BASES), False, real=True)
            found = found or _base_of(getattr(child, "inv_freq", None))
            if found is not None:
                break
    return float(found) if found is not None and found > 1 else ROPE_BASE


def _base_of(inv_freq: object) -> float | None:
    """The base of a rotary embedding's ``inv_freq`` buffer, base ** -(2i / d) for i < d / 2:
    its second entry to the power -(d / 2), to six digits (real bases are round numbers, and a
    float32 buffer is a few ulps off)."""
    if not isinstance(inv_freq, Tensor) or inv_freq.dim() != 1 or inv_freq.numel() < 2:
        return None
    second = inv_freq[1].double().item()
    if not 0 < second < 1:
        return None
    return float(f"{second ** -inv_freq.numel():.6g}")
