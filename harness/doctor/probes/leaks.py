"""Leaks: outputs that depend on inputs the mask hides (the future, padding), found by redrawing
those inputs, also with large logits; and queries that have no key at all."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import Tensor

from harness.dependency import MAX_SPLITS, Leak, Redraws, as_call, future_leak, splits
from harness.doctor.findings import Outcome, Said, failed, named, passed, skipped, warned
from harness.doctor.probes.registry import probe
from harness.doctor.probes.unmasked import unmasked_at
from harness.doctor.subject import Subject
from harness.inputs import generator
from harness.masks import KEY_LAYOUTS
from harness.metrics import first_nonfinite, rounding

LARGE = 300.0  # activation scale for the large-logit leak checks (float64: no overflow)
# A leak that shows only at large logits is a finite fill that they outgrow (old GPT-2's -1e4).
FILL = named(
    " and not at ordinary ones: the mask's fill is a finite constant these logits outgrow: "
    "fill_too_small (fill with -inf, or torch.finfo(dtype).min)",
    "fill_too_small",
)
# A NaN that shows only at large logits is no leak: softmax itself stays finite there, so an exp
# of the scores without the row max subtracted overflowed.
OVERFLOW = named(
    " and not at ordinary ones: NaN, not a leak, as exp of large scores without the row max "
    "subtracted gives (naive_exp_softmax: subtract the row max, or use torch.softmax)",
    "naive_exp_softmax",
)
NO_MASK = "no mask to probe with (forward takes none, or no convention of it worked: see above)"


def no_mask(subject: Subject) -> str:
    """Why a mask probe has no mask: declared none, none found, or one that holds no padding."""
    if subject.config.mask == "none":
        return "--mask none: the caller never passes a mask"
    if subject.takes_mask:  # but not padding of each sequence of its own
        return "its (T, T) mask is one for every sequence: it cannot leave one without keys"
    return NO_MASK


LARGE_SPLITS = 3  # a mask constant too small for large logits fails at every split: a few do


# In a module that caps its scores, only a cap after the mask lets large logits leak: it squashes
# any fill to -cap, where a fill after the cap stays far below the capped scores.
CAPPED = (
    " and not at ordinary ones, in a module that caps its scores at {cap:g}: the cap comes after "
    "the mask and squashes its fill to -{cap:g}, which large logits reach: softcap_after_mask "
    "(cap the scores, then mask them)"
)


def _large(scale: float, nan: bool, cap: float | None = None) -> Said:
    """What a leak found at ``scale`` means: nothing more at ordinary activations; at large ones a
    finite fill the logits outgrow (in a module that caps its scores at ``cap``, the cap put
    after the mask), or (a NaN) an exp that overflowed."""
    if scale == 1.0:
        return Said("")
    fill = named(CAPPED.format(cap=cap), "softcap_after_mask") if cap else FILL
    return f" with activations scaled by {scale:g}" + (OVERFLOW if nan else fill)


def large_scales(subject: Subject) -> tuple[float, ...]:
    """The activation scales a leak is looked for at: ordinary, large, and where the reading
    found a finite fill, the scale at which its scores outgrow it, if larger (the module's
    own init may keep its logits small at ``LARGE``)."""
    at = subject.reading.outgrown_at
    return (1.0, LARGE) + ((round(at, -1),) if at is not None and at > LARGE else ())


def _causal_inputs(subject: Subject, scale: float = 1.0) -> tuple[Tensor, Tensor | None]:
    """The causal probe's inputs at activations times ``scale``, and its causal keep-mask
    (None for a module that takes no mask)."""
    cfg = subject.config
    keep = subject.keep("causal", cfg.batch, cfg.seq_len, 0) if subject.takes_mask else None
    return subject.x(cfg.batch, cfg.seq_len, 3, scale), keep


def _future_leak(subject: Subject, scale: float) -> Leak | None:
    x, keep = _causal_inputs(subject, scale)
    return future_leak(subject.bound(keep), x, None, MAX_SPLITS if scale == 1.0 else LARGE_SPLITS)


def _causal_leak(subject: Subject) -> Said | None:
    """Evidence of a future leak (also with large logits), or None."""
    for scale in large_scales(subject):
        leak = _future_leak(subject, scale)
        if leak:
            return str(leak) + _large(scale, math.isnan(leak.change), subject.softcap)
    return None


def _left_padded(subject: Subject) -> tuple[Tensor, Tensor]:
    """The padding probes' (B, T, T) keep-mask, odd sequences padded on the left, and its (B, T)
    real tokens (as keys, and so as queries)."""
    cfg = subject.config
    keep = subject.keep("padding", cfg.batch, cfg.seq_len, 4, left=True)
    return keep, keep.any(dim=1)  # (B, T)


def _padding_leak(subject: Subject, scales: tuple[float, ...] | None = None) -> Said | None:
    """Evidence that real outputs depend on padded inputs (at ``scales``: by default also with
    large logits), or None."""
    cfg = subject.config
    keep, real = _left_padded(subject)
    for scale in large_scales(subject) if scales is None else scales:
        x = subject.x(cfg.batch, cfg.seq_len, 4, scale)
        redraws = Redraws(as_call(subject.bound(keep), None), x)
        change = redraws.change(~real)  # (B, T)
        leaked = (change.isnan() | (change > 0)) & real
        if leaked.any():
            finite = leaked & ~change.isnan()  # a dependency is better evidence than a NaN
            b, t = (int(i) for i in (finite if finite.any() else leaked).nonzero()[0])
            where = _large(scale, bool(change[b, t].isnan()), subject.softcap)
            padded = (~real[b]).nonzero().flatten().tolist()
            if change[b, t].isnan():
                return f"real output {t} of sequence {b} is NaN with padding" + where
            if not padded:  # it moved although its own sequence has no padding
                return Said(f"real output {t} of sequence {b} depends on other sequences' padding")
            s = redraws.latest(torch.arange(cfg.batch) == b, t, padded)
            return (
                f"real output {t} of sequence {b} depends on padded input {s}: it moves by "
                f"{change[b, t].item():.3g} when its padding changes" + where
            )
    return None


def _responds(subject: Subject) -> bool:
    """Every real output moves when the real inputs are redrawn under a padding mask: a mask read
    so that it hides everything (outputs all zero, or NaN) leaks nothing but says nothing."""
    cfg = subject.config
    keep, real = _left_padded(subject)
    redraws = Redraws(as_call(subject.bound(keep), None), subject.x(cfg.batch, cfg.seq_len, 4))
    change = redraws.change(real)
    return bool((change[real] > 0).all())


def _convention_hint(subject: Subject, check: Callable[[Subject], Said | None]) -> Said:
    """A hint when the same check passes with the opposite bool convention, read so that it
    still lets every real output see real inputs (a reading that hides them all passes any
    leak check, and says nothing)."""
    other = {"keep": "drop", "drop": "keep"}.get(subject.config.mask)
    if other is None:
        return Said("")
    flipped = Subject(subject.module, replace(subject.config, mask=other))
    try:
        passes = check(flipped) is None and _responds(flipped)
    except Exception:
        return Said("")
    if not passes:
        return Said("")
    inverted = ("mask_bool", "sdpa_mask_inverted")
    if subject.adapter.from_model:  # the mask is its model's own
        return named(
            " (it passes with the mask read the other way round: the layer inverts the mask its "
            "own model builds, blocking exactly the keys it should attend: mask_bool, a "
            "keep-mask filled where it is True, or sdpa_mask_inverted, a blocked-is-True mask "
            "given where True attends)",
            *inverted,
        )
    return named(
        f" (it passes with --mask {other}: is that the module's convention? If not, the module "
        f"blocks exactly the keys it should attend: mask_bool, a keep-mask filled where it is "
        f"True, or sdpa_mask_inverted, a blocked-is-True mask given where True attends)",
        *inverted,
    )


def _on_queries(subject: Subject) -> Said:
    """A hint when the padding mask reaches the queries instead of the keys: real queries' outputs
    are what they are with no mask at all, while padded queries' are not. The padded inputs
    are zeroed in both calls, as an encoder that zeroes its padded frames gives them."""
    cfg = subject.config
    keep, real = _left_padded(subject)
    module, x = subject.copy(), subject.x(cfg.batch, cfg.seq_len, 4)
    x = x * real[..., None].to(x.device, x.dtype)  # (B, T, d)
    with torch.no_grad():
        masked = subject.call(module, x, keep)[0].double()
        free = subject.call(module, x, torch.ones_like(keep))[0].double()
    real, apart = real.to(masked.device), (masked - free).abs().nan_to_num(math.inf)
    if apart[~real].numel() == 0 or not (apart[~real] > 0).any():
        return Said("")  # no padded query moved: the mask is not read at all (or reads nothing)
    if apart[real].max().item() > rounding(free[real].abs().max().item(), torch.float32):
        return Said("")
    return named(
        ": real queries' outputs are those of no mask at all while padded queries' change: the "
        "padding mask is applied to the queries, not the keys (padding_on_queries: mask the key "
        "axis, mask[:, None, :])",
        "padding_on_queries",
    )


ONE_AHEAD = (
    "each output t depends on input t + 1 and on none after it: a causal mask one diagonal "
    "off, whatever else it was meant to be (causal_leak: tril(diagonal=1); keep key s for query "
    "t only when s <= t)"
)


def one_ahead(subject: Subject) -> bool:
    """Called with no mask, every output t moves with input t + 1 and with none after it: the
    shape of a causal mask built one diagonal off, which no design gives on purpose."""
    cfg = subject.config
    x = subject.x(cfg.batch, cfg.seq_len, 3)
    try:
        redraws = Redraws(as_call(subject.bound(None), None), x)
    except Exception:  # it needs its mask: the causal probe with one is the mask's own
        return False
    positions = torch.arange(cfg.seq_len)
    for p in splits(cfg.seq_len):
        change = redraws.change((positions >= p).expand(cfg.batch, cfg.seq_len))  # (B, T)
        before, last = change[:, : p - 1], change[:, p - 1]
        if (before.isnan() | (before > 0)).any() or not bool((last > 0).all()):
            return False
    return cfg.seq_len > 2


@probe("causal no-leak")
def probe_causal(subject: Subject) -> Outcome:
    """Position t's output gives zero gradient to inputs after t, also with large logits; for a
    module not declared causal, only the one-ahead shape of a mask one diagonal off."""
    cfg = subject.config
    if not cfg.causal and (not subject.takes_mask or cfg.mask_shape in KEY_LAYOUTS):
        if one_ahead(subject):
            return failed(ONE_AHEAD, "causal_leak")
        return skipped("not causal (--causal) and takes no (B, T, T) mask")
    leak = _causal_leak(subject)
    if leak:
        hint = _convention_hint(subject, _causal_leak)
        if not hint and "scaled by" not in leak.text:  # at ordinary activations, no other reading
            hint = named(": the future is not masked (causal_leak: a mask dropped or built wrong, "
                         "e.g. tril(diagonal=1); keep key s for query t only when s <= t)",
                         "causal_leak")  # fmt: skip
            at = unmasked_at(subject, *_causal_inputs(subject))  # the call that leaked
            if at:  # the call that leaked masks nothing where it attends
                hint = Said(hint.text, hint.traps, at, "the call that leaked attends here with "
                            "nothing masked (no mask applied, is_causal not set)")  # fmt: skip
        return failed(leak + hint)
    if cfg.causal and subject.takes_mask and subject.plan.mask_optional:
        x = subject.x(cfg.batch, cfg.seq_len, 3)
        alone = future_leak(subject.bound(None), x, None)  # called with no mask at all
        reading = subject.reading  # its own masking, with a mask, is whole: Whisper's is_causal
        whole = reading.masks_future and not any(n.trap == "causal_leak" for n in reading.named)
        if alone and whole:  # Whisper's layer: a mask turns it causal
            return warned(
                f"called without a mask, {alone}: it masks the future itself only when it is "
                "given a mask (see the facts read from its forward), so a caller that passes "
                "none gets a bidirectional layer"
            )
        if alone:
            return failed(
                f"called without a mask, {alone}: it does not mask the future by itself, as "
                "--causal says (its caller must pass a causal mask; causal_leak if its own "
                "causal mask is built wrong, e.g. tril(diagonal=1))",
                "causal_leak",
            )
    larger = ", x ".join(f"{scale:g}" for scale in large_scales(subject)[1:])
    return passed(f"no output depends on a later input (also at x {larger})")


@probe("padding no-leak")
def probe_padding(subject: Subject) -> Outcome:
    """Real positions' outputs give zero gradient to padded inputs, also with large logits."""
    if not subject.takes_mask:
        return skipped(no_mask(subject))
    leak = _padding_leak(subject)
    reading = subject.reading
    if leak and reading.mask_unread and reading.masks_future:  # Whisper's decoder layer
        return warned(
            leak + f": the mask's values are never read (at {reading.mask_unread}); given any "
            "mask it masks the future itself, so a padding mask is ignored: right only for a "
            "caller that passes nothing but the causal mask"
        )
    if leak:
        return failed(leak + (_on_queries(subject) or _convention_hint(subject, _padding_leak)))
    on_queries = _on_queries(subject)
    if on_queries:  # padded inputs the caller zeroes: redrawing them shows no leak
        return failed(Said("the padding mask changes no real output") + on_queries)
    if not _responds(subject):
        return failed(
            "real outputs do not respond to the real inputs under a padding mask: the mask hides "
            "them (is the convention inverted?)"
        )
    return passed("real outputs ignore padded inputs and respond to real ones")


@probe("all-masked rows")
def probe_all_masked(subject: Subject) -> Outcome:
    """A sequence that is all padding: NaN there is a warning, NaN elsewhere a failure."""
    cfg = subject.config
    if not subject.pads_each:
        return skipped(no_mask(subject))
    module = subject.copy()
    x = subject.x(cfg.batch, cfg.seq_len, 10).requires_grad_(True)
    padding = subject.keep("padding", cfg.batch, cfg.seq_len, 10)
    with torch.no_grad():
        ordinary, _ = subject.call(module, x, padding)
    allowed = subject.effective_keep(padding, cfg.batch, cfg.seq_len)  # with its window, if any
    has_key = allowed.any(-1).to(ordinary.device)  # (B, T): queries that have a key
    if not torch.isfinite(ordinary[has_key]).all():
        return failed(f"NaN already with ordinary padding, where every query has a key: "
                       f"output{first_nonfinite(ordinary)} (see the other probes)")  # fmt: skip
    keep = subject.keep("padding", cfg.batch, cfg.seq_len, 10, empty=True)
    out, _ = subject.call(module, x, keep)
    with_key = subject.effective_keep(keep, cfg.batch, cfg.seq_len).any(-1)  # (B, T)
    if not torch.isfinite(out[with_key.to(out.device)]).all():
        return failed("one all-padding sequence makes other sequences' outputs NaN")
    if torch.isfinite(out).all():
        return passed("finite for a query with no allowed key")
    G = torch.randn(out.shape, generator=generator(10), dtype=out.dtype).to(out.device)
    trained = [(n, p) for n, p in module.named_parameters() if p.requires_grad]  # not a frozen one
    grads = torch.autograd.grad((out * G).sum(), [p for _, p in trained], allow_unused=True)
    poisoned = [
        n
        for (n, _), g in zip(trained, grads, strict=True)
        if g is not None and not torch.isfinite(g).all()
    ]
    extra = f"; NaN reaches the gradient of {', '.join(poisoned)}" if poisoned else ""
    return warned(
        f"a query with no allowed key gives NaN (output{first_nonfinite(out.detach())}; "
        f"SDPA returns 0 there){extra}",
    )
