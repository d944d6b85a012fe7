"""The model's own cache: prefill then one token per step, and prefill then the rest in one
chunk, give the full forward's logits; a cache reset after another prompt gives what a fresh
one gives; the cache holds as many tokens as were fed."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from harness.doctor.findings import Outcome, failed, passed, skipped, warned
from harness.doctor.model.call import SEQ_LEN, logits_of
from harness.doctor.model.patient import Patient, max_change
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
) -> tuple[Decoded, object]:
    """Feed ``ids`` in chunks of the given lengths through one cache (None: the model makes
    it); ``positions``: pass each chunk's position ids explicitly."""
    call, model = patient.call, model or patient.model
    start, pieces = 0, []
    with torch.no_grad():
        for size in chunks:
            piece = ids[:, start : start + size]
            kwargs = call.kwargs(piece)
            kwargs[call.cache] = cache
            if call.use_cache:
                kwargs["use_cache"] = True
            if positions:
                kwargs[call.positions] = torch.arange(start, start + size).expand_as(piece)
            output = model(**kwargs)
            pieces.append(logits_of(output).double())
            cache = cache_of(output, call.cache)
            start += size
    return Decoded(torch.cat(pieces, dim=1), _length(cache)), cache


def _length(cache: object) -> int | None:
    """How many tokens the cache holds, where it says (None: it cannot; a recurrent state)."""
    read = getattr(cache, "get_seq_length", None)
    try:
        return int(read()) if callable(read) else None
    except Exception:
        return None


SCENARIOS = {
    "one token per step": [PREFILL] + [1] * (SEQ_LEN - PREFILL),
    "chunked prefill": [PREFILL, SEQ_LEN - PREFILL],
}


def cached_generation(patient: Patient) -> Outcome:
    """Each scenario's logits equal the full forward's within the floor. How many tokens the
    cache says it holds is evidence when they do not (appended twice, never cleared), not a
    finding of its own: a looped model or a rolling window counts otherwise."""
    call = patient.call
    if call.cache is None:
        return skipped("the model's forward takes no cache")
    if not patient.causal:
        return skipped("not a causal model: nothing to generate")
    ids = patient.tokens()
    full = patient.logits(ids)
    floor = patient.floor(full)
    results, wrong, lengths, refused = [], [], [], []
    for name, chunks in SCENARIOS.items():
        try:
            got, _ = decode(patient, ids, chunks)
        except LookupError as exc:  # no cache object comes back: it keeps its state itself
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
        if got.length is not None and got.length != SEQ_LEN:
            lengths.append(f"after {name} the cache holds {got.length} tokens of {SEQ_LEN} fed")
    if not wrong:
        counted = f"; {lengths[0]}" if lengths else "; cache length = tokens fed"
        if refused:
            return warned(f"{'; '.join(results)} (floor {floor:.2g}); {refused[0]}: a caller "
                          "must feed it one token at a time")  # fmt: skip
        return passed(f"{'; '.join(results)} (floor {floor:.2g}){counted}")
    name, chunks, first, by = wrong[0]
    size = "not finite" if by == float("inf") else f"{by:.3g}"
    evidence = f"{name} differs from the full forward from position {first} on (by {size}, " \
               f"floor {floor:.2g})"  # fmt: skip
    if call.positions is not None:
        retried, _ = decode(patient, ids, chunks, positions=True)
        if max_change(retried.logits, full) <= floor:
            return failed(f"{evidence}; with position ids passed it agrees: the model's own "
                          "positions restart under a cache (rope_cache_offset)")  # fmt: skip
    if lengths:
        return failed(f"{evidence}; {lengths[0]} (stale_cache: appended twice or never "
                      "cleared)")  # fmt: skip
    return failed(
        f"{evidence}. Known causes: cache_causal_alignment (a causal mask anchored top-left for "
        "fewer queries than keys), stale_cache (keys written to or read from the wrong slots, "
        "or the current token left out)"
    )


def cache_reuse(patient: Patient) -> Outcome:
    """After another prompt and ``reset()``, the cache gives what a fresh one gives."""
    if patient.call.cache is None or not patient.causal:
        return skipped("no cache to reuse")
    ids, other = patient.tokens(), patient.tokens(seed=3)
    chunks = SCENARIOS["one token per step"]
    try:
        fresh, _ = decode(patient, ids, chunks)
    except LookupError as exc:  # no cache object comes back: it keeps its state itself
        return skipped(f"{exc}: its forward keeps its cache inside")
    _, cache = decode(patient, other, chunks)
    if not callable(getattr(cache, "reset", None)):
        return skipped("its cache has no reset(): a new cache per prompt is the only use")
    cache.reset()
    reused, _ = decode(patient, ids, chunks, cache=cache)
    apart = max_change(reused.logits, fresh.logits)
    floor = patient.floor(fresh.logits)
    if apart > floor:
        return failed(
            f"after another prompt and reset(), decoding moves by {apart:.3g} from a "
            "fresh cache's (stale_cache: the reset keeps the previous prompt's keys)"
        )
    return passed(f"reset after another prompt: {apart:.2g} (floor {floor:.2g})")
