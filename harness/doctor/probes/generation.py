"""Generation through the module's own cache: prefill then one-token steps, and chunked prefill,
give the full forward; the cache grows by exactly the tokens fed; a reset cache reused for a new
prompt gives what a fresh one gives.

How the cache is passed is detected from the signature (``harness.doctor.calling``): an object
from the module's own file (updated in place), a tuple passed back (``past_key_value``), or the
module's own buffers addressed by ``start_pos`` / ``input_pos``.
"""

from __future__ import annotations

import contextlib
import inspect
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from harness.consistency import Agreement, agreements
from harness.doctor.caches import Returned
from harness.doctor.calling import AdapterPlan
from harness.doctor.findings import Outcome, Said, failed, named, passed, skipped, warned
from harness.doctor.probes.diverge import Recorded, first_divergence, recording_all
from harness.doctor.probes.registry import probe
from harness.doctor.probes.slots import (
    Call,
    Misplaced,
    Watched,
    decided,
    held,
    misplaced,
    recording,
)
from harness.doctor.reading.masks import BLOCKING
from harness.doctor.reading.record import HARNESS, Recorder, calling_line, shown_path
from harness.doctor.subject import Subject
from harness.masks import KEY_LAYOUTS, causal_keep
from harness.scenarios import Invoke

PROMPT_SEED = 21  # the prompt decoded


def _setup(subject: Subject) -> tuple[str | None, Tensor, Tensor | None]:
    """(why the probe cannot run, or None; the prompt (B, T, d) float64 on the CPU; the causal
    keep-mask when the module takes a mask)."""
    cfg = subject.config
    x = subject.x(cfg.batch, cfg.seq_len, PROMPT_SEED).double().cpu()
    keep = causal_keep(cfg.batch, cfg.seq_len) if subject.takes_mask else None
    if subject.new_cache is None:
        return subject.cache_source, x, keep
    if not cfg.causal and (not subject.takes_mask or cfg.mask_shape in KEY_LAYOUTS):
        return (
            "not causal (--causal) and its mask cannot be a causal one (none, or key padding): "
            "a bidirectional encoder as called, so it is not probed as a decoder"
        ), x, keep  # fmt: skip
    if subject.sequence_first:
        return "sequence-first module: cached calls are not probed", x, keep
    if subject.new_cache is Returned and not _returns_a_cache(subject, x, keep):
        return (
            f"forward takes `{subject.plan.cache}` but returns no cache to pass back: it does "
            "not use one here (an encoder, or a parameter kept for compatibility), so it is not "
            "probed as a decoder"
        ), x, keep  # fmt: skip
    return None, x, keep


def _returns_a_cache(subject: Subject, x: Tensor, keep: Tensor | None) -> bool:
    """One prefill call with a cache to fill: does the module give one back?"""
    cache, module = Returned(), subject.copy()
    mask = subject.encode(keep, torch.float64)
    with torch.no_grad():
        subject.invoke(module, x.to(subject.device), mask, None, cache, 0)
    return cache.value is not None


def _agreements(subject: Subject, x: Tensor, keep: Tensor | None, scenarios: tuple[str, ...],
                positions: Tensor | None = None, invoke: Invoke | None = None,
                dtype: torch.dtype = torch.float32) -> list[Agreement]:  # fmt: skip
    """The scenarios in ``dtype`` against the full forward (float64 unless the module runs
    only in float32), each call made by ``invoke`` (default: the subject's)."""
    return agreements(
        subject.copy(), subject.new_cache, x, keep, subject.spec, positions, subject.device,
        dtype, scenarios, subject.config.seed, invoke or subject.invoke, subject.dtype,
    )  # fmt: skip


def _explicit_positions(subject: Subject, x: Tensor) -> Tensor | None:
    """Positions 0..T-1 to pass explicitly, when forward's position parameter has a default."""
    if not subject.plan.optional_positions:
        return None
    batch, seq_len = x.shape[:2]
    return torch.arange(seq_len).expand(batch, seq_len)


def _recording(subject: Subject, seen: list[tuple[int, int]]) -> Invoke:
    """The subject's calls, noting (tokens fed so far, the cache's own length) after each
    cached call whose cache says its length."""

    def invoke(module: nn.Module, xs: Tensor, mask, positions, cache, start: int) -> object:
        result = subject.invoke(module, xs, mask, positions, cache, start)
        layer = getattr(subject.original, "layer_idx", None)
        length = None if cache is None else _cache_length(cache, layer)
        if length is not None:
            seen.append((start + xs.shape[1], length))
        return result

    return invoke


def _cache_length(cache: object, layer: int | None = None) -> int | None:
    """How many tokens a cache says it holds for the module's own layer (``layer``, its
    ``layer_idx``): ``get_seq_length(layer)``, then ``len()``; None when it does not say. A
    cache of several layers counts each layer's tokens: asked without the layer, transformers'
    ``get_seq_length()`` answers for layer 0, which a module of layer 1 never fills."""
    reads = [lambda c: c.get_seq_length(layer)] if isinstance(layer, int) else []
    for read in (*reads, lambda c: c.get_seq_length(), len):
        try:
            value = read(cache)
        except Exception:
            continue
        if isinstance(value, int):
            return value
    return None


@probe("cached decoding", compares=True)
def probe_decoding(subject: Subject) -> Outcome:
    """Prefill then one-token steps, and chunked prefill, equal the full forward; the cache
    grows by exactly the query length."""
    why_not, x, keep = _setup(subject)
    if why_not is not None:
        return skipped(why_not)
    lengths: list[tuple[int, int]] = []  # noted during the cached calls themselves
    recording = _recording(subject, lengths)
    found = _agreements(subject, x, keep, ("decode", "chunked"), invoke=recording)
    refused = [a.scenario for a in found if a.refused]  # calls its model never makes
    found = [a for a in found if not a.refused]
    if not found:
        return skipped(f"the module or its adapter takes no cached calls: {', '.join(refused)} "
                       "raise NotImplementedError")  # fmt: skip
    wrong = [a for a in found if not a.agrees]
    declared = isinstance(subject.plan, AdapterPlan)  # the user's own calls: raising is a bug
    if (wrong and all(a.failure for a in wrong) and not declared
            and not _first_call_works(subject, x, keep)):  # fmt: skip
        return skipped(  # the detected convention is likely not its own
            f"{subject.cache_source}, but a first call through it raises {wrong[0].failure}: "
            "if it caches, say how with --call"
        )
    if wrong:
        return failed(
            "; ".join(str(a) for a in wrong)
            + (f"; {off}" if (off := _length_off(lengths, subject.window)) else "")
            + _diagnose(subject, x, keep, wrong[0])
        )
    unmasked = _without_mask(subject, x)
    if unmasked is not None:
        return unmasked
    if off := _length_off(lengths, subject.window):
        return failed(f"{off} (stale_cache: appended twice or never cleared)", "stale_cache")
    rolling = subject.window is not None and any(held < fed for fed, held in lengths)
    counted = "; cache length = tokens fed" if lengths else ""
    if rolling:
        counted = f"; cache length = tokens fed, up to its window of {subject.window} (rolling)"
    not_taken = f"; {', '.join(refused)}: not taken (NotImplementedError)" if refused else ""
    return passed(
        f"{'; '.join(str(a) for a in found)} ({subject.cache_source}){counted}{not_taken}"
    )


def _length_off(lengths: list[tuple[int, int]], window: int | None = None) -> str:
    """``the cache holds N tokens after M were fed`` for the first call where they differ. A
    module with a sliding window may keep only the last ``window`` (a rolling cache of fixed
    length, as Mistral's): both lengths are right then, its outputs judged against the full
    forward over the same window."""
    bad = [(fed, held) for fed, held in lengths
           if held != fed and (window is None or held != min(fed, window))]  # fmt: skip
    return f"the cache holds {bad[0][1]} tokens after {bad[0][0]} were fed" if bad else ""


def _first_call_works(subject: Subject, x: Tensor, keep: Tensor | None) -> bool:
    """Whether one call with the whole prompt through a fresh cache runs: then the convention
    is the module's, and later calls that raise are its bug."""
    mask = subject.encode(keep, subject.dtype)
    try:
        with torch.no_grad():
            subject.invoke(subject.copy(), x.to(subject.device, subject.dtype), mask, None,
                           subject.new_cache(), 0)  # fmt: skip
    except Exception:
        return False
    return True


def _without_mask(subject: Subject, x: Tensor) -> Outcome | None:
    """A causal module whose mask is optional is also decoded without one, as callers that
    trust its own causality do: a failure when that differs from its full forward."""
    cfg = subject.config
    if not (cfg.causal and subject.takes_mask and subject.plan.mask_optional):
        return None
    wrong = [a for a in _agreements(subject, x, None, ("decode", "chunked")) if not a.agrees]
    if not wrong:
        return None
    words = named(
        "without a mask (its own causal masking, as callers that pass none rely on): "
        + "; ".join(str(a) for a in wrong)
        + " (cache_causal_alignment: is_causal=True anchors the mask at the top-left when "
        "fewer queries than keys are fed)",
        "cache_causal_alignment",
    )
    if any(a.scenario == "decode" for a in wrong):
        return failed(words)  # even one new token at a time: no caller can use it so
    return warned(  # transformers' layers do this too: their model passes a mask then
        words + "; a caller must pass a mask whenever it feeds several tokens through a cache"
    )


def _top_left(blocked: Tensor) -> bool:
    """The cells a mask blocks, over (..., T, S) scores with fewer queries than keys, are the
    triangle anchored at the top-left (query t kept from keys after t, not after S - T + t)."""
    T, S = blocked.shape[-2:]
    if not T < S:
        return False
    common = blocked.reshape(-1, T, S).all(0)
    return torch.equal(common, torch.ones(T, S, dtype=torch.bool, device=common.device).triu(1))


IS_CAUSAL = "SDPA told is_causal=True"


class _TopLeft(TorchFunctionMode):
    """Notes a causal mask anchored at the top-left in a call with fewer queries than keys, so
    that a new query sees only the first keys: SDPA told ``is_causal=True``
    (pytorch/pytorch#108108), or a triangle the module fills, adds or hands SDPA so."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = ""  # how, once seen
        self.at = ""  # where: the SDPA call told is_causal (a triangle's line is the reading's)
        self.watching = False  # in a call whose first position is not the sequence's first

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.watching and not self.seen:
            with contextlib.suppress(Exception):  # a shape this reading does not expect
                self.seen = self._anchored(func, args, kwargs, out)
            self.at = calling_line() if self.seen == IS_CAUSAL else ""
        return out

    @staticmethod
    def _anchored(func, args: tuple, kwargs: dict, out: object) -> str:
        given = dict(enumerate(args)) | kwargs
        if func is F.scaled_dot_product_attention:
            q, k = given.get(0, given.get("query")), given.get(1, given.get("key"))
            mask = given.get(3, given.get("attn_mask"))
            if given.get(5, given.get("is_causal", False)) and q.shape[-2] < k.shape[-2]:
                return IS_CAUSAL
            if isinstance(mask, Tensor):
                blocked = ~mask if mask.dtype == torch.bool else mask <= BLOCKING
                if _top_left(blocked.expand(*q.shape[:-1], k.shape[-2])):
                    return "the triangle it hands SDPA"
            return ""
        name = getattr(func, "__name__", "")
        if name in ("masked_fill", "masked_fill_") and isinstance(given.get(1), Tensor):
            value = given.get(2)
            if isinstance(value, int | float) and value <= BLOCKING:
                return (
                    "the triangle it fills" if _top_left(given[1].bool().expand(out.shape)) else ""
                )
        if name in ("add", "__add__", "__radd__") and isinstance(out, Tensor):
            added = [t for t in args[:2] if isinstance(t, Tensor) and t.is_floating_point()]
            if any(_top_left((t <= BLOCKING).expand(out.shape)) for t in added
                   if bool((t <= BLOCKING).any())):  # fmt: skip
                return "the triangle it adds"
        return ""


def _writes(subject: Subject, calls: list[Call], top_left: _TopLeft) -> Invoke:
    """The subject's calls, noting (first position, tokens fed, held tensors before and after)
    for each; ``top_left`` watches only the calls after the first, whose queries are not the
    sequence's first tokens (for the first, top-left is where a triangle belongs)."""

    def invoke(module: nn.Module, xs: Tensor, mask, positions, cache, start: int) -> object:
        before = held(module, cache)
        top_left.watching = start > 0
        result = subject.invoke(module, xs, mask, positions, cache, start)
        top_left.watching = False
        if cache is not None:  # not the full forward it is compared with
            calls.append(Call(start, xs.shape[1], before, held(module, cache)))
        return result

    return invoke


def _slots_decided(subject: Subject, x: Tensor, keep: Tensor | None, wrong: Misplaced) -> Said:
    """``wrong``, located: chunked prefill run again with each call recorded, the line that
    decided where the misplaced call wrote (its index, or the counter it was read from)."""
    watched: list[Watched] = []
    with contextlib.suppress(Exception):  # a record is evidence; without it, none is claimed
        _agreements(subject, x, keep, ("chunked",), invoke=recording(subject.invoke, watched))
    found = decided(watched, wrong.call, wrong.name) if len(watched) > wrong.call else None
    said = named(f"; {wrong} (stale_cache: keys written to the wrong slots, then read from "
                 "the right ones)", "stale_cache")  # fmt: skip
    if found is None:
        return said
    write, decider = found
    where = "" if decider.line == write.line else f", through the index at {write.where}"
    why = (f"decides where the cache writes: positions {wrong.start}.."
           f"{wrong.start + wrong.fed - 1} went to slots {wrong.wrote[0]}..{wrong.wrote[-1]} "
           f"of `{wrong.name}`{where}")  # fmt: skip
    return Said(said.text, said.traps, decider.where, why)


def _positions(start: int, count: int) -> str:
    """``position 4``, or ``positions 3..5``."""
    return f"position {start}" if count == 1 else f"positions {start}..{start + count - 1}"


def _diagnose(subject: Subject, x: Tensor, keep: Tensor | None, wrong: Agreement) -> Said:
    """The catalogue trap a decode mismatch matches, as chunked prefill shows it: a cache the
    module holds written at the wrong slots (seen in its tensors), SDPA told is_causal with
    fewer queries than keys (there, or in the failing scenario: one token at a time only);
    else an op that computes for the positions fed what the full forward computes for the
    first ones, in every cached call (not traced with a window, whose rolling buffer holds
    keys at slots that are not positions); else positions that restart on each cached call
    (fixed by passing positions explicitly); else the causes it cannot tell apart, with the
    line where the cached calls first differ."""
    calls: list[Call] = []
    with _TopLeft() as top_left:
        _agreements(subject, x, keep, ("chunked",), invoke=_writes(subject, calls, top_left))
    if (wrong_slots := misplaced(calls)) is not None:
        return _slots_decided(subject, x, keep, wrong_slots)
    if not top_left.seen and wrong.scenario != "chunked":  # a top-left mask for one token only
        with _TopLeft() as top_left:
            _agreements(subject, x, keep, (wrong.scenario,), invoke=_writes(subject, [], top_left))
    if top_left.seen:
        return Said(
            f"; with fewer queries than keys its causal mask ({top_left.seen}) is anchored at "
            "the top-left: a new query sees only the first keys (cache_causal_alignment; "
            "anchor it bottom-right, tril(S - T) of the (T, S) scores, or use is_causal only "
            "when queries and keys are as many)",
            ("cache_causal_alignment",),
            top_left.at,
        )
    traced: list[Recorded] = []
    if subject.window is None:  # a window's rolling buffer holds keys at slots, not positions
        with contextlib.suppress(Exception):  # evidence where it can be had; none without
            recorded = recording_all(subject.invoke, traced)
            _agreements(subject, x, keep, (wrong.scenario,), invoke=recorded, dtype=subject.dtype)
    diverged = first_divergence(traced)
    if diverged is not None and diverged.restarts:
        fed, first = _positions(diverged.start, diverged.fed), _positions(0, diverged.fed)
        return Said(
            f"; at {diverged.op.where} the call fed {fed} computes what the full forward "
            f"computes for {first}: the positions restart at 0 on each cached call "
            "(rope_cache_offset)",
            ("rope_cache_offset",),
            diverged.op.where,
            f"a cached call fed {fed} gets here what {first} gets in the full forward",
        )
    if diverged is not None and diverged.through is not None:
        op = diverged.through
        return Said(
            f"; the call fed {_positions(diverged.start, diverged.fed)} reads at "
            f"{diverged.op.where} an operand that only cached calls assemble, at {op.where}, "
            "and it is not what the full forward computes from the same tokens (stale_cache: "
            "keys or values joined, written or read back wrong)",
            ("stale_cache",),
            op.where,
            "the keys or values a cached call reads are assembled here, and differ from the "
            "full forward's",
        )
    explicit = _explicit_positions(subject, x)
    if explicit is not None:
        retried = _agreements(subject, x, keep, (wrong.scenario,), explicit)[0]
        if retried.agrees:
            return named(
                "; with positions passed explicitly it agrees: the module's default positions "
                "restart at 0 on each cached call (rope_cache_offset)",
                "rope_cache_offset",
            )
    beyond = [] if wrong.steps is None else (wrong.steps > wrong.threshold).nonzero().flatten()
    first = f" from position {int(beyond[0])} on" if len(beyond) else ""
    where = f" (they first differ at {diverged.op.where})" if diverged is not None else ""
    return named(
        f"; wrong{first}: the cached calls do not compute what the full forward does{where}. Known "
        "causes: cache_causal_alignment (a causal mask anchored top-left, e.g. is_causal=True "
        "with fewer queries than keys), rope_cache_offset (positions restarting at 0 on each "
        "call), stale_cache (keys written to or read from the wrong slots)",
        "cache_causal_alignment",
        "rope_cache_offset",
        "stale_cache",
    )


@probe("cache reuse", compares=True)
def probe_reuse(subject: Subject) -> Outcome:
    """A cache reset after another prompt gives what a fresh one gives."""
    why_not, x, keep = _setup(subject)
    if why_not is not None:
        return skipped(why_not)
    if not callable(getattr(subject.new_cache(), "reset", None)):
        return skipped("its cache has no reset(): a new cache per prompt is the only use")
    reused, fresh = _agreements(subject, x, keep, ("reuse", "decode"))
    if fresh.agrees and not reused.agrees:
        said = named(
            f"after another prompt and reset(): {reused} while a fresh cache agrees "
            "(stale_cache: the reset keeps the previous prompt's keys and values)",
            "stale_cache",
        )
        at = _reset_at(subject, x, keep)
        why = "the cache's reset(): a prompt decoded after it differs from one decoded fresh"
        return failed(Said(said.text, said.traps, at, why) if at else said)
    if not fresh.agrees:
        return skipped("decoding with a fresh cache already differs (see cached decoding)")
    return passed(f"reset after another prompt: {reused}")


def _reset_at(subject: Subject, x: Tensor, keep: Tensor | None) -> str:
    """Where the user's ``reset()`` of a cache that held a prompt does its work: the first
    line of it that runs a torch op, else the method's own first line ("" for a cache the
    doctor keeps, or when it cannot be watched)."""
    cache, module = subject.new_cache(), subject.copy()
    reset = inspect.unwrap(getattr(type(cache), "reset", None))
    try:
        path, (lines, first) = inspect.getsourcefile(reset), inspect.getsourcelines(reset)
    except (TypeError, OSError):
        return ""
    if path is None or Path(path).resolve().is_relative_to(HARNESS):
        return ""
    recorder = Recorder({}, {})
    with contextlib.suppress(Exception):
        with torch.no_grad():
            subject.invoke(module, x.to(subject.device), subject.encode(keep, torch.float64),
                           None, cache, 0)  # fmt: skip
        with recorder:
            cache.reset()
    ran = [op for op in recorder.record.ops if op.line]
    return ran[0].where if ran else f"{shown_path(path)}:{first} `{lines[0].strip()}`"
