"""The module under diagnosis: how to call it (the Config) and the calls themselves (Subject)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property

import torch
from torch import Tensor, nn

from harness.dependency import Leak, Repeats, future_leak, repeat_calls
from harness.doctor.caches import Returned, _is_cache
from harness.doctor.calling import (
    OFFSET_NAMES,
    AdapterPlan,
    CallPlan,
    as_self_attention,
    cache_convention,
    is_weights,
    plan_call,
)
from harness.doctor.config import Config, float32_rounding
from harness.doctor.protocol import Adapter
from harness.doctor.reading.known import Reading
from harness.doctor.reading.watch import watch
from harness.doctor.stated import (
    SOFTCAP_NAMES,
    declared_context,
    rope_base,
    rotary_dims,
    width_candidates,
    window_of,
)
from harness.errors import UsageError
from harness.inputs import generator
from harness.masks import (
    CAUSAL_KINDS,
    KEY_LAYOUTS,
    SHARED_LAYOUTS,
    causal_keep,
    encode,
    keep_mask,
)
from harness.reference import (
    Recognized,
    head_count,
    positive_attribute,
    recognize,
    with_scale,
)
from harness.runner import as_dtype, split_output


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
        self.adapter = Adapter(config.call)  # what its --call adapter says, if it has one
        if config.call is not None:
            plan: CallPlan = AdapterPlan(adapter=config.call)
        else:
            plan = plan_call(self.module, self.takes_mask, config.mask_arg, config.rotary_dims)
        # an adapter (a model's recorded call) hands the layer what it takes itself
        said = getattr(module, "batch_first", 1) is False and config.call is None
        self.sequence_first = config.sequence_first or said
        if isinstance(module, nn.MultiheadAttention) and wrap:
            self.sequence_first = False  # its wrapper turns it round itself
        self.original = module  # the module as given (its class's code is read for rotary)
        self._reading: Reading | None = None  # its one recorded forward, read
        self.window, self.window_source = window_of(self.module, config)
        # the layer's own, else its caller's (the model doctor's replay: the model's context)
        self.context = declared_context(self.module) or self.adapter.context
        self.asked_seq_len = config.seq_len  # --seq-len, which the context may shorten
        if self.context is not None and 3 <= self.context < config.seq_len:
            # a module built for shorter sequences is probed within what it takes
            self.config = config = replace(config, seq_len=self.context)
        self.rotary_dims = rotary_dims(self.module, config.rotary_dims)
        self.rope_base = rope_base(self.module, config.rope_base)
        self._plan = replace(plan, rope_base=self.rope_base)  # the tables it makes, if any
        self._cache_plan = self._plan  # the call's convention, before the width is settled
        self.softcap = config.softcap or positive_attribute(self.module, SOFTCAP_NAMES, real=True)
        # how the module is called (its width, dtype, the position parameters it runs with) is
        # settled by calling it: on first use (``settle``), never while it is being made
        self._settled = False
        self._d_model, self._dtype = 0, torch.float64

    def settle(self) -> None:
        """Find, by calling the module, the width and dtype it runs on (and whether it runs
        with its optional position parameters left to their defaults); a UsageError when no
        width can be told. Once; the probes' reads of ``d_model``, ``dtype`` and ``plan`` call
        it first."""
        if self._settled:
            return
        self._settled = True  # the calls below read the width and dtype they try
        self._d_model, self._dtype = self._input_width(self.config.d_model)

    @property
    def d_model(self) -> int:
        self.settle()
        return self._d_model

    @property
    def dtype(self) -> torch.dtype:
        self.settle()
        return self._dtype

    @property
    def plan(self) -> CallPlan:
        self.settle()
        return self._plan

    @plan.setter
    def plan(self, plan: CallPlan) -> None:
        self.settle()
        self._plan = plan

    @cached_property
    def _cache(self) -> tuple[Callable[[], object] | None, str]:
        return cache_convention(self.module, self._cache_plan, self.adapter)

    @property
    def new_cache(self) -> Callable[[], object] | None:
        """What makes a fresh cache for the module (None: it takes none)."""
        return self._cache[0]

    @property
    def cache_source(self) -> str:
        """How the cache is passed, or why there is none."""
        return self._cache[1]

    @cached_property
    def fixed_length(self) -> int | None:
        """The one length the module takes: where it declares a context (an N x N buffer, as
        Swin's relative_position_index of one window), when it runs there but not on 3 tokens;
        else the probes' length, when it runs there and on no length beside it (a Linformer's
        projection of its keys along a sequence of fixed length)."""
        seq_len = self.config.seq_len
        if self.context is not None and (self.context == 3 or seq_len != self.context):
            return None
        if self.runs(3) or not self.runs(seq_len):
            return None
        if self.context is not None:
            return self.context
        return None if self.runs(seq_len - 1) or self.runs(seq_len + 1) else seq_len

    def runs(self, seq_len: int) -> bool:
        """Whether a copy of the module runs on ``seq_len`` tokens of two sequences."""
        if seq_len < 1:
            return False
        try:
            with torch.no_grad():
                self.call(self.copy(), self.x(2, seq_len, 0), self.ordinary_keep(2, seq_len))
        except Exception:
            return False
        return True

    @property
    def length_source(self) -> str:
        """How the one length it takes is known."""
        if self.context is not None:
            return (
                "it declares that context and takes no other length, as a window of fixed size does"
            )
        return "it runs on no length beside it, as a projection along a sequence of fixed length"

    def _input_width(self, given: int | None) -> tuple[int, torch.dtype]:
        """The first candidate width the module runs on, in float64, else in float32 (a module
        that hard-codes float32 somewhere); else the likeliest one, and the probes will show
        what goes wrong."""
        candidates = width_candidates(self.module, given)
        if not candidates:
            raise UsageError("cannot tell the module's input width: pass --d-model")
        plan = self._plan
        # optional position parameters that take something else than (B, T) positions (DETR's
        # pos, an embedding), or rotary tables in another form than the doctor makes
        # (MEGABYTE's rotary_emb object), are left to their default when the module runs only so
        dropped = (*plan.optional_positions, *plan.optional_tables)
        plain = replace(plan, positions=tuple(n for n in plan.positions if n not in dropped))
        for self._plan in dict.fromkeys((plan, plain)):
            for dtype in (torch.float64, torch.float32):
                self._dtype = dtype
                module = self.copy()
                for width in candidates:
                    self._d_model = width
                    try:
                        with torch.no_grad():
                            out, _ = self.call(module, self.x(2, 3, 0), self.ordinary_keep(2, 3))
                    except Exception:
                        continue
                    if out.dim() == 3 and tuple(out.shape[:2]) == (2, 3):
                        return width, dtype
        self._plan = plan
        return candidates[0], torch.float64

    def float32_if_finite(self) -> bool:
        """Probe in float32 from now on, where an ordinary call of the float64 copy is not
        finite and one of a float32 copy is: a module that fills with its dtype's
        ``finfo.min`` and takes its softmax in float32 (transformers' eager attention) gets
        -inf from float64's, and NaN on a query whose keys are all masked, which it never
        gives in a dtype it runs in. Whether it did."""
        if self.dtype != torch.float64:
            return False
        batch, seq_len = self.config.batch, self.config.seq_len
        self._dtype = torch.float32
        try:
            with torch.no_grad():
                out, _ = self.call(
                    self.copy(), self.x(batch, seq_len, 0), self.ordinary_keep(batch, seq_len)
                )
            if torch.isfinite(out).all():
                return True
        except Exception:
            pass
        self._dtype = torch.float64
        return False

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
        return self.adapter.kv_grouping

    @property
    def reading(self) -> Reading:
        """Its one recorded forward, read (``diagnose`` records it once and sets it; a subject
        made alone records it on first use; a call that breaks leaves an empty reading)."""
        if self._reading is None:
            try:
                self._reading = watch(self).reading(self.config.causal)
            except UsageError:
                raise
            except Exception:
                self._reading = Reading()
        return self._reading

    @reading.setter
    def reading(self, reading: Reading) -> None:
        self._reading = reading

    @property
    def positional(self) -> bool:
        """Positions matter: no permutation equivariance expected."""
        return self.position_scheme != "none"

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
        scale the module means (--scale; else 1/sqrt(head width)), in as many heads as the
        recorded forward shows (its queries' width over the width its product contracts)."""
        return [with_scale(found, self.config.scale) for found in self.recognized(module)]

    def recognized(self, module: nn.Module, extra: bool = False) -> list[Recognized]:
        """Every reading of ``module``'s projections as they are (no scale of its own), by the
        roles and in the heads its recorded forward shows (``extra``: as ``recognize``)."""
        if self.reading.gated:  # its output is not attention's alone: nothing to compare
            return []
        dtype = next((p.dtype for p in module.parameters()), self.dtype)
        found = recognize(module, extra, roles=self.reading.projections)
        return [self._heads_read(one, dtype) for one in found]

    def _heads_read(self, found: Recognized, dtype: torch.dtype) -> Recognized:
        """``found`` in the recorded forward's heads, where they differ from the ones its
        attributes state (rtdl keeps its count as ``_n_heads``)."""
        qkv, out, heads, described = found
        width = self.reading.head_width
        if not width:
            return found
        try:
            with torch.no_grad():
                q = qkv(torch.zeros(1, 1, self.d_model, dtype=dtype))[0]
        except Exception:  # a reading of other widths: left as it is
            return found
        read = q.shape[-1] // width if q.shape[-1] % width == 0 else heads
        if read == heads:
            return found
        return qkv, out, read, described.replace(f"with {heads} head(s)", f"with {read} head(s)")

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
        out, weights = self._outputs(module, x, keep, positions, defaults)
        if isinstance(weights, Tensor) and weights.dim() == 4 and self.heads_first:
            weights = weights.transpose(0, 1)  # (h, B, T, S) -> (B, h, T, S)
        if self._reading is not None and self._reading.second_not_weights:
            return out, None  # shaped like weights, computed from no softmax: a position bias
        return out, weights if is_weights(weights, x.shape[0], x.shape[1]) else None

    def _outputs(
        self,
        module: nn.Module,
        x: Tensor,
        keep: Tensor | None,
        positions: Tensor | None = None,
        defaults: bool = False,
    ) -> tuple[Tensor, object]:
        """(output (B, T, d), its second output as returned, whatever it is) of one call."""
        mask = self.encode(keep, x.dtype)
        seq = x.transpose(0, 1) if self.sequence_first else x
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = self.plan.call(module, seq, mask, positions, defaults=defaults,
                                    sequence_first=self.sequence_first)  # fmt: skip
        out, second = split_output(result)
        return (out.transpose(0, 1) if self.sequence_first else out), second  # (B, T, d)

    @cached_property
    def heads_first(self) -> bool:
        """Whether the 4-D weights it returns are (h, B, T, S), fairseq's layout (torchscale's),
        not (B, h, T, S): seen on one call with a batch of another size than the probes', whose
        axis 1 then takes that size."""
        batch, seq_len = self.config.batch + 1, self.config.seq_len
        try:
            with torch.no_grad():
                keep = self.ordinary_keep(batch, seq_len)
                _, weights = self._outputs(self.copy(), self.x(batch, seq_len, 0), keep)
        except Exception:
            return False
        return (
            isinstance(weights, Tensor) and weights.dim() == 4
            and weights.shape[1] == batch != weights.shape[0]
        )  # fmt: skip

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
    output responds to (rotary if its recorded forward rotates its queries or keys), or a
    rotation its recorded forward shows."""
    config, plan = subject.config, subject.plan
    if config.positions != "auto":
        return Positions(config.positions, "declared (--positions)")
    if plan.rotary and subject.responds_to_positions():
        return Positions("relative", "forward takes rotary tables")
    if plan.rotary:  # a layer built without rotary whose forward still takes the tables (ESM)
        return Positions("none", "forward takes rotary tables, but its output ignores them")
    if subject.adapter.hands_rotary_tables:  # litgpt's attn(x, cos, sin, ...)
        # where the positions a probe asks cannot reach the tables (its model makes them for
        # 0..T-1, or they index a cache it keeps), that the layer uses them is not seen: not firm
        ignores = subject.adapter.ignores_positions
        if ignores or subject.responds_to_positions():
            return Positions("relative", "its model hands it rotary tables", firm=not ignores)
    rotated = subject.reading.rotary
    named = f"its forward rotates its queries or keys at {rotated}" if rotated else ""
    given = next((n for n in plan.positions if n not in OFFSET_NAMES), None)
    if subject.adapter.ignores_positions:  # its caller has no positions to give
        given = None
    if given is not None and subject.responds_to_positions():
        if named:
            return Positions("relative", f"its output follows `{given}` and {named}")
        return Positions("absolute", f"its output follows `{given}`")
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
