"""The model's own cache: prefill then one token per step, and prefill then the rest in one
chunk, give the full forward's logits; a cache reset after another prompt gives what a fresh
one gives; the cache holds as many tokens as were fed."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from harness.doctor.caches import cache_class
from harness.doctor.findings import KNOWN_CAUSES, Outcome, failed, passed, skipped, warned
from harness.doctor.model.call import SEQ_LEN, logits_of, positions_of, restore_state
from harness.doctor.model.call import keeps_state as call_keeps_state
from harness.doctor.model.patient import Patient, max_change
from harness.doctor.model.tables import handed_table, row_of
from harness.runner import describe

PREFILL = SEQ_LEN // 2


def cache_of(output: object, name: str) -> object:
    """The cache a forward returns: ``output.<name>`` (transformers' ``cache``, formerly
    ``past_key_values``), else the second item of a tuple."""
    for attr in (name, "past_key_values", "cache"):
        found = getattr(output, attr, None)
        if found is not None:
            return found
    if isinstance(output, tuple) and len(output) > 1 and not isinstance(output[1], Tensor):
        return output[1]
    raise LookupError("the model returned no cache")


@dataclass(frozen=True)
class Decoded:
    """Logits (B, T, V) fed through the cache in chunks, and the cache's length after."""

    logits: Tensor
    length: int | None


def decode(
    patient: Patient,
    ids: Tensor,
    chunks: list[int],
    cache: object = None,
    positions: bool = False,
    model: nn.Module | None = None,
    gap: int = 0,
) -> tuple[Decoded, object]:
    """Feed ``ids`` in chunks of the given lengths through one cache (None: the model makes
    it); ``positions``: pass each chunk's position ids explicitly, those of the chunks after the
    first moved on by ``gap``. A model that keeps its cache inside runs as a copy of ``model``,
    else of the patient as it was built."""
    call, used = patient.call, model
    model = model or patient.model
    inside = call.cache is None  # a model that keeps its cache itself, in a copy made here
    given = cache is not None  # the caller's: the model updates it in place, or returns it
    if inside:
        model = copy.deepcopy(model)
        if used is None:  # the cache as the model was built, not as earlier probes left it
            restore_state(model, patient.built)
        call.prepare(model, ids.shape[0])
    start, pieces = 0, []
    with torch.no_grad():
        for size in chunks:
            piece = ids[:, start : start + size]
            wanted = positions or inside or call.needs_positions
            moved = start + (gap if start else 0)
            kwargs = call.kwargs(piece, positions=positions_of(piece, moved) if wanted else None)
            if not inside:
                kwargs[call.cache] = cache
            if call.use_cache:
                kwargs["use_cache"] = True
            output = model(**kwargs)
            pieces.append(logits_of(output).double())
            if inside:
                cache = model
            elif not given or _returns_cache(output):
                cache = cache_of(output, call.cache)
            start += size
    return Decoded(torch.cat(pieces, dim=1), None if inside else _length(cache)), cache


def _returns_cache(output: object) -> bool:
    try:
        cache_of(output, "cache")
    except LookupError:
        return False
    return True


def first_decode(
    patient: Patient, ids: Tensor, chunks: list[int]
) -> tuple[Decoded, Callable[[], object]]:
    """``decode`` through the cache the model makes, or, where a forward that takes one makes
    none (``forward(ids, cache=None)``), through a new one of the class its file defines
    (``...Cache`` with ``update``); with what makes the next one (None: the model).
    LookupError when it makes none and its file defines none."""
    try:
        return decode(patient, ids, chunks)[0], lambda: None
    except LookupError:
        kind = cache_class(patient.model)
        if kind is None:
            raise LookupError("the model returned no cache and its file defines no cache "
                              "class") from None  # fmt: skip
        return decode(patient, ids, chunks, cache=kind())[0], kind


def _length(cache: object) -> int | None:
    """How many tokens the cache holds, where it says (None: it cannot; a recurrent state)."""
    read = getattr(cache, "get_seq_length", None)
    try:
        return int(read()) if callable(read) else None
    except Exception:
        return None


# A prompt of 5 then single tokens: a rolling cache of 2, 3 or 4 slots wraps inside the prompt
# and the prompt's last keys must land in the slots their positions own.
LONG_PREFILL = SEQ_LEN - 3
SCENARIOS = {
    "one token per step": [PREFILL] + [1] * (SEQ_LEN - PREFILL),
    "chunked prefill": [PREFILL, SEQ_LEN - PREFILL],
    "long prefill": [LONG_PREFILL] + [1] * (SEQ_LEN - LONG_PREFILL),
}


def cached_generation(patient: Patient) -> Outcome:
    """Each scenario's logits equal the full forward's within the floor. How many tokens the
    cache says it holds is evidence when they do not (appended twice, never cleared), not a
    finding of its own: a looped model or a rolling window counts otherwise."""
    call = patient.call
    if not patient.causal:
        return skipped("not a causal model: nothing to generate")
    if call.cache is None and not keeps_state(patient):
        return skipped("the model's forward takes no cache and it keeps none between forwards")
    ids = patient.tokens()
    full = patient.logits(ids, **({} if call.cache else {"positions": positions_of(ids)}))
    floor = patient.floor(full)
    results, wrong, lengths, refused = [], [], [], []
    counts = False  # the cache says how many tokens it holds
    new_cache: Callable[[], object] | None = None
    for name, chunks in SCENARIOS.items():
        try:
            if new_cache is None:
                got, new_cache = first_decode(patient, ids, chunks)
            else:
                got, _ = decode(patient, ids, chunks, cache=new_cache())
        except LookupError as exc:
            return skipped(f"{exc}: its forward keeps its cache inside")
        except Exception as exc:
            if name == "one token per step":
                raise
            refused.append(f"{name} raises {describe(exc)}")  # a refusal, said (ProphetNet's)
            continue
        steps = (got.logits - full).abs().nan_to_num(float("inf")).amax(dim=(0, 2))  # (T,)
        results.append(f"{name}: {steps.max().item():.2g}")
        if steps.max().item() > floor:
            wrong.append((name, chunks, int((steps > floor).nonzero()[0]), steps.max().item()))
        counts = counts or got.length is not None
        if got.length is not None and got.length != SEQ_LEN:
            lengths.append(f"after {name} the cache holds {got.length} tokens of {SEQ_LEN} fed")
    if not wrong:
        counted = f"; {lengths[0]}" if lengths else ""
        if counts and not lengths:
            counted = "; cache length = tokens fed"
        if refused:
            return warned(f"{'; '.join(results)} (floor {floor:.2g}); {refused[0]}: a caller "
                          "must feed it one token at a time")  # fmt: skip
        return passed(f"{'; '.join(results)} (floor {floor:.2g}){counted}")
    name, chunks, first, by = wrong[0]
    size = "not finite" if by == float("inf") else f"{by:.3g}"
    evidence = f"{name} differs from the full forward from position {first} on (by {size}, " \
               f"floor {floor:.2g})"  # fmt: skip
    can_retry = call.positions is not None and call.cache is not None  # positions passed
    ignored = can_retry and not follows_positions(patient)
    if ignored:  # it rebuilds them (arange(T)): passing them proves nothing
        evidence += "; its forward ignores the position ids it is given"
        can_retry = False
    if can_retry:
        fresh = new_cache() if new_cache is not None else None
        retried, _ = decode(patient, ids, chunks, cache=fresh, positions=True)
        if max_change(retried.logits, full) <= floor:
            return failed(f"{evidence}; with position ids passed it agrees: the model's own "
                          "positions restart under a cache (rope_cache_offset)",
                          "rope_cache_offset")  # fmt: skip
        fresh = new_cache() if new_cache is not None else None
        moved, _ = decode(patient, ids, chunks, cache=fresh, positions=True, gap=PREFILL)
        if max_change(moved.logits, retried.logits) <= floor:  # passing them proves nothing
            evidence += "; under its cache it ignores the position ids it is given"
            can_retry = False
    if lengths:
        return failed(f"{evidence}; {lengths[0]} (stale_cache: appended twice or never "
                      "cleared)", "stale_cache")  # fmt: skip
    if [w[0] for w in wrong] == ["long prefill"]:
        return failed(f"{evidence}, while prompts of {PREFILL} agree: a prompt longer than a "
                      "rolling cache's slots wraps, and its last keys land in slots their "
                      "positions do not own (stale_cache: written in order instead of at "
                      "position % slots)", "stale_cache")  # fmt: skip
    restart = positions_restart(patient) if call.cache is None else None
    if restart:
        return failed(
            f"{evidence}; the rotary table the model hands its layers for a token fed at "
            f"position {PREFILL} is position 0's: its positions restart under the cache it keeps "
            "(rope_cache_offset: each call's positions counted from 0 instead of from its start)",
            "rope_cache_offset",
        )
    if patient.attends and [w[0] for w in wrong] == ["chunked prefill"]:
        return failed(
            f"{evidence}, while one token per step agrees: a chunk of several queries over more "
            "keys is masked as if it started at key 0 (cache_causal_alignment: a causal mask "
            "anchored top-left for fewer queries than keys)",
            "cache_causal_alignment",
        )
    stepped = [w[0] for w in wrong][:1] == ["one token per step"]
    first_only = _first_keys_only(patient, new_cache) if stepped else None
    if first_only:
        return failed(
            f"{evidence}; the token fed at position {PREFILL} does not see the token at "
            f"{PREFILL - 2} through the cache (changing it moves nothing there), as its full "
            "forward does: its mask lets one query see the first key only (cache_causal_alignment:"
            " a causal mask anchored top-left for fewer queries than keys)",
            "cache_causal_alignment",
        )
    stale = ("stale_cache", "keys written to or read from the wrong slots, or the current token "
             "left out")  # fmt: skip
    if first_only is False and (can_retry or restart is False):
        return failed(
            f"{evidence}; the token fed at position {PREFILL} sees the earlier tokens through "
            "the cache, and its positions are counted on from it, so the cache holds the wrong "
            f"keys: {stale[0]} ({stale[1]})",
            "stale_cache",
        )
    causes = [] if first_only is False else [("cache_causal_alignment", "a causal mask anchored "
                                              "top-left for fewer queries than keys")]  # fmt: skip
    causes.append(stale)
    if not can_retry and restart is not False:
        causes.append(("rope_cache_offset", "each chunk's positions counted from 0 instead of "
                       "from where the cache ends"))  # fmt: skip
    listed = ", ".join(f"{trap} ({gloss})" for trap, gloss in causes)
    return failed(f"{evidence}. {KNOWN_CAUSES}{listed}", *(trap for trap, _ in causes))


def follows_positions(patient: Patient) -> bool:
    """The model's logits move when the position ids it is given do: 0..T-1, then the same with
    a gap of PREFILL after the first half (a shift of them all would not move rotary logits,
    which see offsets only); True where that cannot be run (the model decides)."""
    ids = patient.tokens()
    base = positions_of(ids)
    gapped = base + PREFILL * (base >= ids.shape[1] // 2)
    try:
        before = patient.logits(ids, positions=base)
        after = patient.logits(ids, positions=gapped)
    except Exception:  # positions it refuses: nothing learned here
        return True
    return max_change(before, after) > patient.floor(before)


def _first_keys_only(patient: Patient, new_cache: Callable[[], object] | None) -> bool:
    """Decoding one token per step, the logits at PREFILL ignore the token at PREFILL - 2 (in
    the cache by then), while the full forward's follow it."""
    ids = patient.tokens()
    changed = ids.clone()
    changed[:, PREFILL - 2] = patient.tokens(seed=5)[:, PREFILL - 2]
    if max_change(patient.logits(ids)[:, PREFILL], patient.logits(changed)[:, PREFILL]) <= 0:
        return False  # the model itself ignores that token there
    chunks = SCENARIOS["one token per step"]
    got = [decode(patient, t, chunks, cache=new_cache() if new_cache else None)[0].logits
           for t in (ids, changed)]  # fmt: skip
    return max_change(got[0][:, PREFILL], got[1][:, PREFILL]) <= patient.floor(got[0])


def positions_restart(patient: Patient) -> bool | None:
    """Whether the rotary table a model that keeps its cache inside hands its layers for one
    token fed at position PREFILL is position 0's (True) rather than PREFILL's (False), as its
    full forward's table reads; None where no layer is handed a table with a row per token."""
    ids = patient.tokens()
    args = (patient.model, patient.call)
    full = handed_table(*args, ids, 0, patient.built)
    one = handed_table(*args, ids[:, PREFILL : PREFILL + 1], PREFILL, patient.built)
    rows = None if full is None or one is None else row_of(full, one)
    if not rows or rows == list(range(full.shape[0])):  # no match, or a table of equal rows
        return None
    return PREFILL not in rows and 0 in rows


def keeps_state(patient: Patient) -> bool:
    """``call.keeps_state`` on the first tokens of the patient's prompt."""
    return call_keeps_state(patient.model, patient.call, patient.tokens()[:, :PREFILL])


def cache_reuse(patient: Patient) -> Outcome:
    """After another prompt and ``reset()``, the cache gives what a fresh one gives."""
    if patient.call.cache is None or not patient.causal:
        return skipped("no cache to reuse")
    ids, other = patient.tokens(), patient.tokens(seed=3)
    chunks = SCENARIOS["one token per step"]
    try:
        fresh, new_cache = first_decode(patient, ids, chunks)
    except LookupError as exc:
        return skipped(f"{exc}: its forward keeps its cache inside")
    _, cache = decode(patient, other, chunks, cache=new_cache())
    if not callable(getattr(cache, "reset", None)):
        return skipped("its cache has no reset(): a new cache per prompt is the only use")
    cache.reset()
    reused, _ = decode(patient, ids, chunks, cache=cache)
    apart = max_change(reused.logits, fresh.logits)
    floor = patient.floor(fresh.logits)
    if apart > floor:
        return failed(
            f"after another prompt and reset(), decoding moves by {apart:.3g} from a "
            "fresh cache's (stale_cache: the reset keeps the previous prompt's keys)",
            "stale_cache",
        )
    return passed(f"reset after another prompt: {apart:.2g} (floor {floor:.2g})")
