"""The module under diagnosis: how to call it (the Config) and the calls themselves (Subject)."""

from __future__ import annotations

import inspect
import io
import math
import re
import sys
import textwrap
import tokenize
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from functools import cached_property, lru_cache
from typing import Any

import torch
from torch import Tensor, nn

from harness.dependency import Leak, Repeats, future_leak, repeat_calls
from harness.doctor.options import BY_NAME
from harness.errors import UsageError, shorten
from harness.inputs import generator
from harness.masks import (
    CAUSAL_KINDS,
    KEY_LAYOUTS,
    SHARED_LAYOUTS,
    MaskSpec,
    causal_keep,
    encode,
    keep_mask,
)
from harness.metrics import rounding
from harness.reference import (
    HEAD_DIM_ATTRS,
    KV_BUFFER,
    ROPE_BASE,
    Recognized,
    head_count,
    int_attribute,
    is_mask,
    positive_attribute,
    recognize,
    with_scale,
)
from harness.runner import as_dtype, seeded, split_output


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
    positional: bool = option("positional")
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
    float16: bool = option("float16")
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


def is_weights(second: Tensor | None, batch: int, seq_len: int) -> bool:
    """A second output counts as attention weights only if it looks like them: (B, [h,] T, T)
    with every finite value in [0, 1]; pre-softmax logits, caches and the like do not."""
    if second is None or second.dim() not in (3, 4) or second.shape[0] != batch:
        return False
    if tuple(second.shape[-2:]) != (seq_len, seq_len) or not second.is_floating_point():
        return False
    finite = second[torch.isfinite(second)].double()
    return bool(((finite >= -1e-6) & (finite <= 1 + 1e-6)).all())


class Subject:
    """The module under diagnosis, seen through the config: builds masks and calls it."""

    def __init__(self, module: nn.Module, config: Config):
        # an adapter calls the module as the user's model does: it gets the module itself
        wrap = config.call is None
        self.module = as_self_attention(module, config.mask_shape) if wrap else module
        self.config = config
        self.device = torch.device(config.device)
        self.takes_mask = config.spec is not None
        # its mask says which keys of each sequence are padding; a (T, T) one holds the same
        # padding for every sequence, so it cannot leave one sequence without keys
        self.pads_each = self.takes_mask and config.mask_shape not in SHARED_LAYOUTS
        self.spec = config.spec
        if config.call is not None:
            self.plan: CallPlan = AdapterPlan(adapter=config.call)
        else:
            self.plan = plan_call(self.module, self.takes_mask, config.mask_arg,
                                  config.rotary_dims)  # fmt: skip
        self.sequence_first = config.sequence_first or getattr(module, "batch_first", 1) is False
        if isinstance(module, nn.MultiheadAttention) and wrap:
            self.sequence_first = False  # its wrapper turns it round itself
        self.original = module  # the module as given (its class's code is read for rotary)
        self.new_cache, self.cache_source = cache_convention(self.module, self.plan)
        self.window, self.window_source = window_of(self.module, config)
        # the layer's own, else its caller's (the model doctor's replay: the model's context)
        self.context = declared_context(self.module) or getattr(config.call, "context", None)
        self.asked_seq_len = config.seq_len  # --seq-len, which the context may shorten
        if self.context is not None and 3 <= self.context < config.seq_len:
            # a module built for shorter sequences is probed within what it takes
            self.config = config = replace(config, seq_len=self.context)
        self.rotary_dims = rotary_dims(self.module, config.rotary_dims)
        self.rope_base = rope_base(self.module, config.rope_base)
        self.plan = replace(self.plan, rope_base=self.rope_base)  # the tables it makes, if any
        self.softcap = config.softcap or positive_attribute(self.module, SOFTCAP_NAMES, real=True)
        self.dtype = torch.float64
        self.d_model, self.dtype = self._input_width(config.d_model)
        self.fixed_length = self._fixed_length()

    def _fixed_length(self) -> int | None:
        """The one length the module takes, when it declares a context (an N x N buffer, as
        Swin's relative_position_index of one window) and runs there but not on 3 tokens."""
        if self.context is None or self.context == 3 or self.config.seq_len != self.context:
            return None
        module = self.copy()

        def runs(seq_len: int) -> bool:
            try:
                with torch.no_grad():
                    self.call(module, self.x(2, seq_len, 0), self.ordinary_keep(2, seq_len))
            except Exception:
                return False
            return True

        return self.context if runs(self.context) and not runs(3) else None

    def _input_width(self, given: int | None) -> tuple[int, torch.dtype]:
        """The first candidate width the module runs on, in float64, else in float32 (a module
        that hard-codes float32 somewhere); else the likeliest one, and the probes will show
        what goes wrong."""
        candidates = width_candidates(self.module, given)
        if not candidates:
            raise UsageError("cannot tell the module's input width: pass --d-model")
        plan = self.plan
        # optional position parameters that take something else than (B, T) positions (DETR's
        # pos, an embedding) are left to their default when the module runs only so
        plain = replace(plan, positions=tuple(
            n for n in plan.positions if n not in plan.optional_positions))  # fmt: skip
        for self.plan in dict.fromkeys((plan, plain)):
            for dtype in (torch.float64, torch.float32):
                self.dtype = dtype
                module = self.copy()
                for width in candidates:
                    self.d_model = width
                    try:
                        with torch.no_grad():
                            out, _ = self.call(module, self.x(2, 3, 0), self.ordinary_keep(2, 3))
                    except Exception:
                        continue
                    if out.dim() == 3 and tuple(out.shape[:2]) == (2, 3):
                        return width, dtype
        self.plan = plan
        return candidates[0], torch.float64

    def copy(self, dtype: torch.dtype | None = None) -> nn.Module:
        """A copy in eval mode, in ``dtype`` (default: float64, or float32 for a module that
        runs only in float32)."""
        return as_dtype(self.module, self.device, dtype or self.dtype).eval()

    @cached_property
    def positions_found(self) -> Positions:
        """The module's position scheme, and how it is known (measured on first use)."""
        return position_scheme(self)

    @property
    def position_scheme(self) -> str:
        return self.positions_found.scheme

    @property
    def position_source(self) -> str:
        return self.positions_found.source

    @cached_property
    def sinks(self) -> str:
        """The name of the module's attention sinks, "" when it has none: a parameter named
        ``sinks`` (or ``...sink(s)``) holding one logit per head, which each row's softmax
        also normalizes over (gpt-oss, StreamingLLM), so rows sum to less than 1."""
        heads = head_count(self.module)
        found = [
            n for n, p in self.module.named_parameters()
            if n.rsplit(".", 1)[-1].endswith(("sink", "sinks")) and p.numel() == heads
        ]  # fmt: skip
        return found[0] if found else ""

    @property
    def kv_grouping(self) -> str:
        """The declared K/V grouping, else the one the adapter's library lays out, else auto."""
        if self.config.kv_grouping != "auto":
            return self.config.kv_grouping
        return getattr(self.config.call, "kv_grouping", "auto")

    @property
    def positional(self) -> bool:
        """Positions matter: no permutation equivariance expected."""
        return self.config.positional or self.position_scheme != "none"

    def responds_to_positions(self) -> bool:
        """Moving half of the tokens one position on (positions passed) changes the output."""
        cfg = self.config
        x = self.x(cfg.batch, cfg.seq_len, 29)
        keep = self.ordinary_keep(cfg.batch, cfg.seq_len)
        base = torch.arange(cfg.seq_len).expand(cfg.batch, cfg.seq_len)
        moved = base + (torch.arange(cfg.seq_len) >= cfg.seq_len // 2)
        module = self.copy()
        with torch.no_grad():
            out = self.call(module, x, keep, base)[0].double()
            out_moved = self.call(module, x, keep, moved)[0].double()
        change = (out_moved - out).abs().nan_to_num(0.0).max().item()
        return change > float32_rounding(out.abs().max().item())

    @cached_property
    def repeats(self) -> Repeats:
        """Two identical calls in eval mode (``dependency.repeat_calls``)."""
        cfg = self.config
        keep = self.ordinary_keep(cfg.batch, cfg.seq_len)
        return repeat_calls(self.bound(keep), self.x(cfg.batch, cfg.seq_len, 12), None, cfg.seed)

    @property
    def repeat_difference(self) -> float:
        """Max |difference| of two identical calls in eval mode (0: deterministic; NaN: an
        output is not finite)."""
        return self.repeats.difference

    @property
    def input_change(self) -> float:
        """Max |change| one call makes to its input tensor in place (0: left alone)."""
        return self.repeats.input_change

    @cached_property
    def masks_future(self) -> bool:
        """Causal: declared (--causal), or measured: under its ordinary mask (or none) no output
        depends on a later input, as a module that masks the future by itself gives."""
        if self.config.causal:
            return True
        cfg = self.config
        keep = self.ordinary_keep(cfg.batch, cfg.seq_len)
        x = self.x(cfg.batch, cfg.seq_len, 3)
        return future_leak(self.bound(keep), x, None) is None

    @cached_property
    def leak_by_itself(self) -> Leak | None:
        """Called with no mask, the earliest output that depends on a later input; None: the
        module masks the future itself (what --causal declares), not through a mask its caller
        passes."""
        cfg = self.config
        return future_leak(self.bound(None), self.x(cfg.batch, cfg.seq_len, 3), None)

    @property
    def deterministic(self) -> bool:
        """Two identical calls agree (or their outputs cannot be compared: not finite)."""
        return not self.repeat_difference > 0

    def x(self, batch: int, seq_len: int, seed: int, scale: float = 1.0) -> Tensor:
        gen = generator(seed)
        x = torch.randn(batch, seq_len, self.d_model, generator=gen, dtype=torch.float64)
        return (x * scale).to(self.device, self.dtype)

    def keep(
        self, kind: str, batch: int, seq_len: int, seed: int, empty: bool = False,
        left: bool = False,
    ) -> Tensor:  # fmt: skip
        """A (B, T, T) keep-mask: causal, padding (lengths drawn from ``seed``) or both. With
        ``left``, odd sequences are padded on the left, as batches for generation are: a causal
        module that ignores its padding mask can then be seen reading the padding."""
        keep = keep_mask(kind, batch, seq_len, generator(seed + 7), empty)
        if self.config.mask_shape in SHARED_LAYOUTS and kind != "causal":
            keep = self._shared(keep, seq_len)
            if kind in CAUSAL_KINDS:
                keep &= causal_keep(batch, seq_len)
        if left and kind == "padding":
            flipped = slice(None) if self.config.mask_shape in SHARED_LAYOUTS else slice(1, None, 2)
            keep[flipped] = keep[flipped].flip(-1)  # (B, T, T): real keys at the end
        return keep

    @staticmethod
    def _shared(keep: Tensor, seq_len: int) -> Tensor:
        """The same padding for every sequence, as one (T, T) mask must give it: the first
        padded sequence's keys (half of them when none is padded)."""
        lengths = keep[:, -1].sum(-1)  # (B,): the last query sees every real key
        padded = lengths[lengths < seq_len]
        length = int(padded[0]) if padded.numel() else max(1, seq_len // 2)
        real = torch.arange(seq_len) < length  # (T,)
        return real.expand_as(keep).clone()  # (B, T, T): every query, every sequence

    def readings(self, module: nn.Module) -> list[Recognized]:
        """Every reading of ``module``'s projections (``reference.recognize``), at the softmax
        scale the module means (--scale; else 1/sqrt(head width))."""
        return [with_scale(found, self.config.scale) for found in recognize(module)]

    def encode(self, keep: Tensor | None, dtype: torch.dtype) -> Tensor | None:
        """The keep-mask in the module's convention and layout, on the device."""
        return encode(keep, self.spec, self.device, dtype)

    def call(
        self,
        module: nn.Module,
        x: Tensor,
        keep: Tensor | None,
        positions: Tensor | None = None,
        defaults: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """(output (B, T, d), weights or None) of one call; ``positions`` (B, T) go to the
        module's position parameters (None: 0..T-1, or with ``defaults`` its own default)."""
        mask = self.encode(keep, x.dtype)
        seq = x.transpose(0, 1) if self.sequence_first else x
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = self.plan.call(module, seq, mask, positions, defaults=defaults)
        out, weights = split_output(result)
        if self.sequence_first:
            out = out.transpose(0, 1)  # (T, B, d) -> (B, T, d)
        return out, weights if is_weights(weights, x.shape[0], x.shape[1]) else None

    def invoke(
        self,
        module: nn.Module,
        x: Tensor,
        mask: Tensor | None,
        positions: Tensor | None,
        cache: object,
        start: int,
    ) -> object:
        """One call of a generation scenario (``harness.scenarios``): the mask already encoded,
        the cache made by ``new_cache``. A returned cache is taken out of the result and kept
        for the next call; the rest is returned as forward gave it."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = self.plan.call(module, x, mask, positions, cache, start, defaults=True)
        if isinstance(cache, Returned) and isinstance(result, tuple | list):
            found = [i for i, r in enumerate(result) if i > 0 and _is_cache(r)]
            if found:
                cache.value = result[found[0]]
                result = tuple(r for i, r in enumerate(result) if i != found[0])
        return result

    def grad_of(self, x: Tensor, keep: Tensor | None, select: Callable[[Tensor], Tensor]) -> Tensor:
        """d select(output).sum() / dx on a fresh float64 copy (zeros when x is unused)."""
        module = self.copy()
        x = x.detach().requires_grad_(True)
        out, _ = self.call(module, x, keep)
        (grad,) = torch.autograd.grad(select(out).sum(), x, allow_unused=True)
        return torch.zeros_like(x) if grad is None else grad

    def depends(self, seq_len: int) -> list[list[int]]:
        """For each output t of an ordinary call on ``seq_len`` tokens, the inputs it depends
        on (exactly: a float64 gradient), over the sequences where t has a key."""
        cfg = self.config
        x = self.x(cfg.batch, seq_len, 43)
        keep = self.ordinary_keep(cfg.batch, seq_len)
        allowed = self.effective_keep(keep, cfg.batch, seq_len) if cfg.causal else keep
        found = []
        for t in range(seq_len):
            grad = self.grad_of(x, keep, lambda out, t=t: out[:, t])  # (B, T, d)
            if allowed is not None:  # sequences where query t has a key (not all padding)
                grad = grad[allowed.expand(cfg.batch, seq_len, seq_len)[:, t].any(-1)]
            found.append((grad.abs().amax(dim=(0, 2)) > 0).nonzero().flatten().tolist())
        return found

    @cached_property
    def reach(self) -> Reach:
        """A sliding window's reach each side, from what the middle output of an ordinary call on
        2w + 3 tokens depends on (a causal one reaches one side only; a bidirectional one's
        reach follows conventions that differ: transformers' |t - s| <= w, ModernBERT's w / 2),
        and what every output depends on."""
        seq_len = 2 * (self.window or 0) + 3
        if self.window is None or (self.context is not None and seq_len > self.context):
            return Reach(None, seq_len, [])
        depends = self.depends(seq_len)
        t = seq_len // 2
        seen = depends[t]
        radius = t - seen[0] if seen else None
        if radius is None or seen != list(range(t - radius, t + radius + 1)):
            radius = None  # not a band around the middle output
        return Reach(radius, seq_len, depends)

    def bound(self, keep: Tensor | None) -> nn.Module:
        """A float64 copy that takes only x and always applies ``keep`` in the module's convention,
        for the shared checks of ``harness.dependency``."""
        subject, module = self, self.copy()

        class Bound(nn.Module):
            def forward(self, x: Tensor, _mask: Tensor | None = None):
                return subject.call(module, x, keep)

        return Bound()

    def ordinary_keep(self, batch: int, seq_len: int) -> Tensor | None:
        """The mask for ordinary calls: causal when the module takes one, padding for key masks."""
        if not self.takes_mask:
            return None
        return self.keep(
            "padding" if self.config.mask_shape in KEY_LAYOUTS else "causal", batch, seq_len, 0
        )

    def effective_keep(self, keep: Tensor | None, batch: int, seq_len: int) -> Tensor | None:
        """What the module should allow: the mask passed, the causal one if it is causal, and
        its sliding window if it has one (w keys up to the query; in a bidirectional module,
        the reach each side its middle output shows: ``reach``)."""
        causal = causal_keep(batch, seq_len) if self.config.causal else None
        if self.window is not None:
            ago = torch.arange(seq_len)[:, None] - torch.arange(seq_len)[None, :]  # (T, T)
            if self.config.causal or not self.reach.two_sided:
                band = ago < self.window  # (T, T): w keys up to the query, and any later
            else:
                reach = self.reach.radius if self.reach.radius is not None else seq_len
                band = ago.abs() <= reach
            causal = band if causal is None else causal & band
        if keep is None or not self.takes_mask:
            return causal
        return keep if causal is None else keep & causal


@dataclass(frozen=True)
class Reach:
    """A bidirectional window measured: inputs each side of the middle output (None: not a
    band around it), on ``seq_len`` tokens, and what each output depends on."""

    radius: int | None
    seq_len: int
    depends: list[list[int]]

    @property
    def two_sided(self) -> bool:
        """The middle output depends on a later input: not a causal window."""
        middle = self.seq_len // 2
        return bool(self.depends) and any(s > middle for s in self.depends[middle])


def _is_cache(value: object) -> bool:
    """A returned cache: keys and values as a tuple of tensors, or stacked in one (2, B, h, T, d)
    tensor (old GPT-2 code's ``torch.stack((key, value))``), or an object with ``update``."""
    if isinstance(value, tuple | list):
        return len(value) >= 2 and all(isinstance(t, Tensor) for t in value)
    if isinstance(value, Tensor):  # attention weights are 4-D: (B, h, T, T)
        return value.dim() == 5 and value.shape[0] == 2
    return callable(getattr(value, "update", None))


def cache_class(module: nn.Module) -> type | None:
    """A cache class the module's own file defines or imports: a class named ``...Cache`` with
    an ``update`` method that can be built without arguments (the catalogue's ``KVCache``,
    transformers' ``DynamicCache``)."""
    source = sys.modules.get(type(module).__module__)
    found = sorted(vars(source).items()) if source else []
    found.sort(key=lambda item: item[0] == "Cache")  # an abstract base last
    for name, value in found:
        if not (isinstance(value, type) and name.endswith("Cache")):
            continue
        if not callable(getattr(value, "update", None)):
            continue
        try:
            value()
        except Exception:
            continue
        return value
    return None


def cache_convention(module: nn.Module, plan: CallPlan) -> tuple[Callable[[], object] | None, str]:
    """How to make the module an empty cache, and how that was found; (None, why not) when the
    forward takes no cache the doctor can make."""
    if isinstance(plan, AdapterPlan):
        make = getattr(plan.adapter, "make_cache", None)
        make = make or getattr(sys.modules.get(plan.adapter.__module__), "make_cache", None)
        if callable(make):
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


# Rotary named in code: rotary, rotate_half, freqs_cis, ALiBi, and rope as a word of its own in a
# name (rope, apply_rope, rope_cache, applyRope; never europe or tropes).
ROTARY_WORDS = re.compile(
    r"(?i:rotary|rotate_half|freqs_cis|\balibi)|(?<![A-Za-z])(?i:rope)(?![a-z])|(?<=[a-z])Rope(?![a-z])"
)


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


def code_names(module: nn.Module) -> list[str]:
    """The names in the code of the module's class and its bases up to nn.Module (what their
    methods call): identifiers only, so that a comment or docstring that mentions rotary does
    not count."""
    names = []
    for cls in type(module).__mro__:
        if cls in (nn.Module, object) or cls.__module__.startswith("torch."):
            continue
        names += _class_names(cls)
    return names


@lru_cache(maxsize=256)
def _class_names(cls: type) -> tuple[str, ...]:
    """The identifiers in the code of ``cls`` itself, read once per class (``getsource`` parses
    the class's whole file)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (OSError, TypeError, tokenize.TokenError, SyntaxError):
        return ()
    return tuple(token.string for token in tokens if token.type == tokenize.NAME)


@dataclass(frozen=True)
class Positions:
    """A module's position scheme (none | absolute | relative), how it is known, and whether
    that is firm (declared, or seen in its signature or its behaviour) or only read off the
    names in its code."""

    scheme: str
    source: str
    firm: bool = True


# An embedding of positions: learned absolute ones (pos_emb, wpe's position_embeddings) or a
# learned relative bias (T5's relative_attention_bias, rel_pos_bias).
POSITION_EMBEDDING = re.compile(r"pos|relative|\brel_", re.IGNORECASE)


def position_scheme(subject: Subject) -> Positions:
    """Declared by --positions; else detected: rotary tables in the signature, positions the
    output responds to (rotary if its code names it), or rotary named in its code."""
    config, plan = subject.config, subject.plan
    if config.positions != "auto":
        return Positions(config.positions, "declared (--positions)")
    if plan.rotary and subject.responds_to_positions():
        return Positions("relative", "forward takes rotary tables")
    if plan.rotary:  # a layer built without rotary whose forward still takes the tables (ESM)
        return Positions("none", "forward takes rotary tables, but its output ignores them")
    if getattr(config.call, "hands_rotary_tables", False):  # litgpt's attn(x, cos, sin, ...)
        # where the positions a probe asks cannot reach the tables (its model makes them for
        # 0..T-1, or they index a cache it keeps), that the layer uses them is not seen: not firm
        ignores = getattr(config.call, "ignores_positions", False)
        if ignores or subject.responds_to_positions():
            return Positions("relative", "its model hands it rotary tables", firm=not ignores)
    code = " ".join(code_names(subject.original))
    words = sorted({w.lower() for w in ROTARY_WORDS.findall(code)})
    named = f"its code names {words[0]}" if words else ""
    given = next((n for n in plan.positions if n not in OFFSET_NAMES), None)
    if getattr(config.call, "ignores_positions", False):  # its caller has no positions to give
        given = None
    if given is not None and subject.responds_to_positions():
        if named:
            return Positions("relative", f"its output follows `{given}` and {named}")
        return Positions("absolute", f"its output follows `{given}`")
    if config.positional:
        return Positions("absolute", "declared (--positional)")
    embedding = next((n for n, m in subject.original.named_modules()
                      if isinstance(m, nn.Embedding) and POSITION_EMBEDDING.search(n)),
                     None)  # fmt: skip
    if embedding is not None:
        return Positions("absolute", f"it holds a position embedding, `{embedding}`")
    if given is not None:
        why = f"{named}, but " if named else ""
        return Positions("none", f"{why}its output ignores `{given}`", firm=not named)
    if named:
        return Positions("relative", f"{named} (declare --positions to overrule)", firm=False)
    return Positions("none", "no positions detected")


# How real forwards name their arguments: the input (or query, key and value for
# self-attention) and the mask. A forward is called by these names, never by position into an
# argument of another meaning (a cross-attention input, a cache, positions).
INPUT_NAMES = ("x", "hidden_states", "inputs", "input", "hidden", "tgt", "src", "seq",
               "inputs_embeds", "embeddings", "features", "tokens")  # fmt: skip
QKV_NAMES = (("query", "key", "value"), ("q", "k", "v"), ("queries", "keys", "values"))
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


class Returned:
    """A cache that the module returns and is given back on the next call (``layer_past``,
    ``past_key_value`` tuples): the doctor keeps the last one here."""

    def __init__(self) -> None:
        self.value: object = None

    def reset(self) -> None:
        self.value = None

    def __len__(self) -> int:
        held = isinstance(self.value, tuple | list | Tensor) and len(self.value) > 0
        keys = self.value[0] if held else None  # a stacked (2, B, h, T, d) one: keys first
        return 0 if not isinstance(keys, Tensor) else keys.shape[-2]


class Internal:
    """The module keeps its own cache, addressed by ``start_pos`` / ``input_pos``: nothing to
    pass, nothing to reset (a new prompt overwrites it from position 0)."""

    def reset(self) -> None:
        return None


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
    ) -> object:
        """Call forward with x and the mask; ``positions`` (B, T) go to every position
        parameter (None: ``start + arange``, or with ``defaults`` the module's own default
        where it has one); ``cache`` to the cache parameter, ``start`` (tokens already cached)
        to an offset."""
        if self.positional:
            return module(x) if mask is None else module(x, mask)
        kwargs: dict[str, object] = dict.fromkeys(self.inputs, x)
        if mask is not None and self.mask is not None:
            kwargs[self.mask] = mask
        batch, seq_len = x.shape[:2]
        given = positions
        if positions is None:
            positions = start + torch.arange(seq_len, device=x.device).expand(batch, seq_len)
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
    ) -> object:
        if positions is None:
            batch, seq_len = x.shape[:2]
            positions = start + torch.arange(seq_len, device=x.device).expand(batch, seq_len)
        return self.adapter(module, x, positions=positions, mask=mask, cache=cache)


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
    qkv = next((t for t in QKV_NAMES if all(n in named for n in t)), None)
    first = next(iter(named))
    inputs = qkv or (next((n for n in INPUT_NAMES if n in named), first),)
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
