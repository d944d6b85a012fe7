"""How the doctor calls a module: which of forward's parameters get the input, the mask, positions
and a cache (``plan_call``, ``CallPlan``; ``AdapterPlan`` for a ``--call`` adapter), how it
makes the cache a forward takes (``cache_convention``), the rotary tables it makes for a forward
that asks for them, and nn.MultiheadAttention as self-attention."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from harness.doctor.caches import Internal, Returned, cache_class
from harness.doctor.protocol import Adapter
from harness.doctor.stated import head_width, rotary_dims
from harness.errors import UsageError
from harness.masks import (
    KEY_LAYOUTS,
    SHARED_LAYOUTS,
)
from harness.reference import KV_BUFFER, ROPE_BASE


class MultiheadSelfAttention(nn.Module):
    """Adapts ``nn.MultiheadAttention`` to ``forward(x, mask)`` self-attention.

    ``mask`` is in the module's own convention (bool True = blocked, or additive float): a key
    padding mask (B, T) goes to ``key_padding_mask``; (B, T, T) or (B, 1, T, T) to ``attn_mask``,
    repeated per head. Sequence-first modules (``batch_first=False``) get (T, B, d). Weights come
    back per head.
    """

    def __init__(self, mha: nn.MultiheadAttention, layout: str | None = None):
        super().__init__()
        self.mha = mha
        self.layout = layout  # the mask's layout (None: a 2-D mask is key padding)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        B, T = x.shape[:2]
        shared = self.layout in SHARED_LAYOUTS
        padding = None
        if mask is not None and (self.layout in KEY_LAYOUTS or (mask.dim() == 2 and not shared)):
            padding = mask.reshape(B, T)  # (B, T)
        attn_mask = None
        if mask is not None and shared:
            attn_mask = mask  # (T, T): torch's own form, for every sequence and head
        elif mask is not None and padding is None:
            attn_mask = mask.reshape(-1, T, T).repeat_interleave(self.mha.num_heads, dim=0)
        seq = x if self.mha.batch_first else x.transpose(0, 1)  # (T, B, d) when not batch_first
        out, weights = self.mha(seq, seq, seq, key_padding_mask=padding, attn_mask=attn_mask,
                                need_weights=True, average_attn_weights=False)  # fmt: skip
        return (out if self.mha.batch_first else out.transpose(0, 1)), weights


# nn.MultiheadAttention's own mask parameters: --mask-arg may name either, and its adapter
# hands the mask to the one its shape belongs to
MHA_MASKS = ("key_padding_mask", "attn_mask")


def as_self_attention(module: nn.Module, layout: str | None = None) -> nn.Module:
    """The module itself, or an adapter for torch's own ``nn.MultiheadAttention`` that passes
    masks of ``layout`` where it takes them."""
    if isinstance(module, nn.MultiheadAttention):
        if not module._qkv_same_embed_dim:
            raise UsageError(
                f"nn.MultiheadAttention(embed_dim={module.embed_dim}, kdim={module.kdim}, "
                f"vdim={module.vdim}) is cross-attention: its keys and values are not the "
                "queries' width, and the doctor probes self-attention (give it kdim = vdim = "
                "embed_dim, or call it your way with --call)"
            )
        return MultiheadSelfAttention(module, layout)
    return module


def is_weights(second: Tensor | None, batch: int, seq_len: int) -> bool:
    """A second output counts as attention weights only if it looks like them: (B, [h,] T, T)
    with every finite value in [0, 1]; pre-softmax logits, caches and the like do not."""
    if second is None or second.dim() not in (3, 4) or second.shape[0] != batch:
        return False
    if tuple(second.shape[-2:]) != (seq_len, seq_len) or not second.is_floating_point():
        return False
    finite = second[torch.isfinite(second)].double()
    return bool(((finite >= -1e-6) & (finite <= 1 + 1e-6)).all())


# How real forwards name their arguments: the input (or query, key and value for
# self-attention) and the mask. A forward is called by these names, never by position into an
# argument of another meaning (a cross-attention input, a cache, positions).
INPUT_NAMES = ("x", "hidden_states", "inputs", "input", "hidden", "tgt", "src", "seq",
               "inputs_embeds", "embeddings", "features", "tokens")  # fmt: skip


# The names of a (q, k, v) forward's three inputs, each by its role, singular or plural in any
# mix (``forward(values, keys, query, mask)``): self-attention gives each the input.
QKV_ROLES = {"query": "q", "queries": "q", "q": "q", "key": "k", "keys": "k", "k": "k",
             "value": "v", "values": "v", "v": "v"}  # fmt: skip


def qkv_inputs(params: Iterable[str]) -> tuple[str, ...] | None:
    """forward's query, key and value parameters, when it names one of each, else None."""
    named = [n for n in params if n in QKV_ROLES]
    roles = {QKV_ROLES[n] for n in named}
    return tuple(named) if len(named) == 3 and roles == {"q", "k", "v"} else None


MASK_NAMES = ("mask", "attn_mask", "attention_mask", "key_padding_mask", "src_mask", "padding_mask",
              "src_key_padding_mask", "tgt_mask", "pad_mask", "input_mask")  # fmt: skip


# A mask parameter by what it is, beyond the names above (fairseq's future_mask, a
# src_padding_mask): its name says mask, and it is not a flag or a count that configures one.
MASK_WORD = re.compile(r"(?:^|_)mask(?:$|_)", re.IGNORECASE)


NOT_MASKS = re.compile(r"^(?:use|need|return|output|apply|is|has)_|_(?:id|ids|idx|type|value)$")


def is_mask_name(name: str) -> bool:
    """A parameter named as a mask: one of MASK_NAMES, or a name with the word mask in it."""
    return name in MASK_NAMES or (bool(MASK_WORD.search(name)) and not NOT_MASKS.search(name))


def mask_names(params: Iterable[str]) -> list[str]:
    """forward's mask parameters: the common names first, in MASK_NAMES' order, then others."""
    names = list(params)
    return [n for n in MASK_NAMES if n in names] + [
        n for n in names if n not in MASK_NAMES and is_mask_name(n)
    ]


# Position inputs the doctor can make: rotary tables in the two common forms, and positions.
ROTARY_NAMES = ("position_embeddings", "freqs_cis", "rotary_emb", "rope", "cos_sin")


TABLE_NAMES = tuple(n for n in ROTARY_NAMES if n != "freqs_cis")  # given (cos, sin) tables


POSITION_NAMES = ("position_ids", "cache_position", "positions", "pos", "input_pos")


OFFSET_NAMES = ("start_pos", "offset", "past_length", "seqlen_offset")  # 0: no cached prefix


# Caches: an object passed in (and updated), or a tuple passed in and returned; ``use_cache``
# switches returning it on.
CACHE_NAMES = ("cache", "kv_cache", "past_key_value", "past_key_values", "layer_past")


USE_CACHE_NAMES = ("use_cache",)


def rotary_tables(
    name: str, positions: Tensor, head_dim: int, x: Tensor, layout: str = "half",
    base: float = ROPE_BASE,
) -> object:  # fmt: skip
    """Standard RoPE tables (base 10000) for ``positions`` (B, T): transformers' ``(cos, sin)``,
    each (B, T, head_dim), or Meta's complex ``freqs_cis`` (T, head_dim / 2) from the first
    row. ``layout`` of (cos, sin): ``half``, each angle at i and i + d/2 (rotate_half's), or
    ``pairs``, at 2i and 2i + 1 (interleaved code's)."""
    inv_freq = base ** -(torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions.to("cpu", torch.float64)[..., None] * inv_freq  # (B, T, head_dim / 2)
    if name == "freqs_cis":  # complex64 beside float32 inputs, complex128 beside float64
        first = angles[0]  # (T, head_dim / 2)
        return torch.polar(torch.ones_like(first), first).to(x.device, _complex(x.dtype))
    if layout == "half":
        table = torch.cat([angles, angles], dim=-1)  # (B, T, head_dim)
    else:
        table = angles.repeat_interleave(2, dim=-1)  # (B, T, head_dim)
    return table.cos().to(x.device, x.dtype), table.sin().to(x.device, x.dtype)


def _complex(dtype: torch.dtype) -> torch.dtype:
    return torch.complex128 if dtype == torch.float64 else torch.complex64


def counted(x: Tensor, start: int = 0, sequence_first: bool = False) -> Tensor:
    """(B, T) positions ``start + 0 .. T-1`` for the tokens of ``x``, (B, T, d), or (T, B, d)
    with ``sequence_first`` (the positions stay (B, T) whatever the activations' layout)."""
    batch, seq_len = x.shape[1::-1] if sequence_first else x.shape[:2]
    return start + torch.arange(seq_len, device=x.device).expand(batch, seq_len)


@dataclass(frozen=True)
class CallPlan:
    """Which of forward's parameters get the input, the mask, positions and the cache, and how."""

    inputs: tuple[str, ...] = ()  # parameter names given x (query, key and value: all three)
    mask: str | None = None  # the parameter given the mask
    positional: bool = False  # forward(*args): x (and the mask) passed by position
    positions: tuple[str, ...] = ()  # parameters given positions or rotary tables
    mask_optional: bool = False  # the mask parameter has a default: it may be left out
    head_dim: int = 0  # the rotary tables' width
    optional_positions: tuple[str, ...] = ()  # position parameters with a default
    optional_tables: tuple[str, ...] = ()  # rotary-table parameters with a default
    cache: str | None = None  # the parameter given the cache
    use_cache: str | None = None  # the flag that makes the module return its cache
    optional_offsets: tuple[str, ...] = ()  # offsets (start_pos) with a default
    table_layout: str = "half"  # how (cos, sin) tables lay the angles out: rotary_tables
    rope_base: float = ROPE_BASE  # the rotary tables' base

    @property
    def rotary(self) -> bool:
        return any(n in ROTARY_NAMES for n in self.positions)

    @property
    def takes_positions(self) -> bool:
        """Positions (or tables made from them) can be passed: a shift or a swap can be asked."""
        return any(n not in OFFSET_NAMES for n in self.positions)

    def call(
        self,
        module: nn.Module,
        x: Tensor,
        mask: Tensor | None,
        positions: Tensor | None = None,
        cache: object = None,
        start: int = 0,
        defaults: bool = False,
        sequence_first: bool = False,
    ) -> object:
        """Call forward with x and the mask; ``positions`` (B, T) go to every position
        parameter (None: ``start + arange``, or with ``defaults`` the module's own default
        where it has one); ``cache`` to the cache parameter, ``start`` (tokens already cached)
        to an offset; ``sequence_first``: x is (T, B, d), the positions still (B, T)."""
        if self.positional:
            return module(x) if mask is None else module(x, mask)
        kwargs: dict[str, object] = dict.fromkeys(self.inputs, x)
        if mask is not None and self.mask is not None:
            kwargs[self.mask] = mask
        given = positions
        if positions is None:
            positions = counted(x, start, sequence_first)
        for name in self.positions:
            if name in self.optional_offsets and cache is None:
                continue  # no cache in play: the module's own default (no cached prefix)
            if name in OFFSET_NAMES:
                kwargs[name] = start
            elif defaults and given is None and name in self.optional_positions:
                continue  # the module's own default is part of what is probed
            elif name in ROTARY_NAMES:
                kwargs[name] = rotary_tables(name, positions, self.head_dim, x,
                                             self.table_layout, self.rope_base)  # fmt: skip
            elif name == "cache_position":
                kwargs[name] = positions[0]  # (T,): transformers' cache positions
            else:
                kwargs[name] = positions
        if self.cache is not None and cache is not None and not isinstance(cache, Internal):
            kwargs[self.cache] = cache.value if isinstance(cache, Returned) else cache
        if self.use_cache is not None:
            kwargs[self.use_cache] = isinstance(cache, Returned)
        return module(**kwargs)


@dataclass(frozen=True)
class AdapterPlan(CallPlan):
    """Every call goes through the user's adapter: ``adapter(module, x, positions=(B, T),
    mask=..., cache=...)``; positions always given (``start + arange(T)`` by default)."""

    adapter: Callable[..., object] | None = None
    positions: tuple[str, ...] = ("positions",)
    mask: str | None = "mask"
    mask_optional: bool = True
    cache: str | None = "cache"

    def call(
        self,
        module: nn.Module,
        x: Tensor,
        mask: Tensor | None,
        positions: Tensor | None = None,
        cache: object = None,
        start: int = 0,
        defaults: bool = False,
        sequence_first: bool = False,
    ) -> object:
        if positions is None:
            positions = counted(x, start, sequence_first)
        return self.adapter(module, x, positions=positions, mask=mask, cache=cache)


def mask_parameters(module: nn.Module) -> list[str]:
    """forward's mask parameters under common names, in the order of MASK_NAMES."""
    try:
        params = inspect.signature(as_self_attention(module).forward).parameters
    except (TypeError, ValueError):
        return []
    if isinstance(module, nn.MultiheadAttention):  # its adapter takes one mask for both
        return ["mask"]
    return mask_names(params)


def _mask_name(params: Mapping[str, object], wanted: str | None = None) -> str | None:
    """The mask parameter: ``wanted`` (--mask-arg), else the first common mask name."""
    if wanted is not None:
        if wanted not in params:
            raise UsageError(f"--mask-arg {wanted}: forward has no parameter of that name")
        return wanted
    return next(iter(mask_names(params)), None)


def plan_call(
    module: nn.Module, takes_mask: bool, mask_arg: str | None = None,
    declared_rotary: int | None = None,
) -> CallPlan:  # fmt: skip
    """How to call ``module``'s forward with x (and a mask); UsageError when it cannot be.
    Rotary tables it takes are as wide as the dimensions it turns (``rotary_dims``)."""
    forward = as_self_attention(module).forward
    try:
        params = dict(inspect.signature(forward).parameters)
    except (TypeError, ValueError):
        return CallPlan(positional=True)
    if not params:
        name = type(module).__name__
        raise UsageError(f"{name}.forward() cannot be called as forward(x): it takes no input")
    named = {n: p for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    if not named or any(p.kind is p.POSITIONAL_ONLY for p in named.values()):
        return CallPlan(positional=True)
    qkv = qkv_inputs(named)
    first = next(iter(named))
    inputs = qkv or (next((n for n in INPUT_NAMES if n in named), first),)
    if isinstance(module, nn.MultiheadAttention | MultiheadSelfAttention) and mask_arg in MHA_MASKS:
        mask_arg = "mask"  # its adapter's one mask, handed on by its shape (see above)
    mask = _mask_name(named, mask_arg)
    signature = f"{type(module).__name__}.forward{inspect.signature(forward)}"
    if takes_mask and mask is None:
        raise UsageError(
            f"{signature} cannot be called as forward(x, mask): no parameter named "
            f"{', '.join(MASK_NAMES[:4])}, ...; drop --mask, or wrap it"
        )
    made = (*ROTARY_NAMES, *POSITION_NAMES, *OFFSET_NAMES)
    positions = tuple(n for n in named if n in made)
    empty = inspect.Parameter.empty
    optional = mask is not None and named[mask].default is not empty
    cache = next((n for n in CACHE_NAMES if n in named), None)
    plan = CallPlan(
        inputs=inputs, mask=mask if takes_mask else None, positions=positions,
        head_dim=(rotary_dims(module, declared_rotary) or head_width(module)) if positions else 0,
        mask_optional=optional,
        optional_positions=tuple(
            n for n in positions
            if named[n].default is not empty and n in POSITION_NAMES  # tables are never optional
        ),
        optional_tables=tuple(
            n for n in positions if named[n].default is not empty and n in ROTARY_NAMES
        ),
        cache=cache, use_cache=next((n for n in USE_CACHE_NAMES if n in named), None),
        optional_offsets=tuple(
            n for n in positions if n in OFFSET_NAMES and named[n].default is not empty
        ),
    )  # fmt: skip
    others = [
        n for n, p in named.items()
        if p.default is empty and n not in plan.inputs and n != plan.mask
        and n not in positions
    ]  # fmt: skip
    if others:
        hint = "" if takes_mask else "; if it takes a mask, say which with --mask"
        raise UsageError(
            f"{signature} cannot be called as forward(x): it needs {', '.join(others)}, which "
            f"the doctor cannot make{hint}; or call it the way your model does, --call FILE.py:FN"
        )
    return plan


def cache_convention(
    module: nn.Module, plan: CallPlan, adapter: Adapter
) -> tuple[Callable[[], object] | None, str]:
    """How to make the module an empty cache, and how that was found; (None, why not) when the
    forward takes no cache the doctor can make."""
    if isinstance(plan, AdapterPlan):
        make = adapter.make_cache()
        if make is not None:
            return make, "the adapter's make_cache()"
        return None, "the adapter defines no make_cache(): no cache to probe"
    if plan.positional:
        return None, "forward(*args): no cache parameter to pass"
    if plan.cache is not None:
        cls = cache_class(module)
        if cls is not None:
            return cls, f"`{plan.cache}` given a fresh {cls.__name__}() from the module's file"
        if plan.cache in ("past_key_value", "past_key_values", "layer_past"):
            return Returned, f"`{plan.cache}` given back what the previous call returned"
        return None, f"`{plan.cache}` takes a cache the doctor cannot make: pass --call"
    internal = [n for n in plan.positions if n in (*OFFSET_NAMES, "input_pos")]
    held = [n for n, _ in module.named_buffers() if KV_BUFFER.fullmatch(n.split(".")[-1])]
    held += [n for n, v in vars(module).items()  # a cache object, set up (not None or a flag)
             if "cache" in n.lower() and not n.startswith("_")
             and v is not None and not isinstance(v, bool | int | float | str)]  # fmt: skip
    if internal and held:
        return Internal, f"its own cache ({held[0]}), addressed by `{internal[0]}`"
    return None, "forward takes no cache (cache, past_key_value(s), layer_past, start_pos, ...)"
