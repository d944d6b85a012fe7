"""Agreement with F.scaled_dot_product_attention on the module's own projections, within the
noise floor; on disagreement, the catalogue trap whose arithmetic the module reproduces."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness import metrics
from harness.doctor.causality import declared
from harness.doctor.config import ROTARY_STYLE
from harness.doctor.findings import Outcome, Said, failed, named, passed, skipped
from harness.doctor.probes.inside import projection_input, submodule_name
from harness.doctor.probes.registry import probe
from harness.doctor.probes.scale import judged, measure
from harness.doctor.subject import Subject
from harness.masks import KEY_LAYOUTS, causal_keep, live_queries
from harness.reference import (
    ROPE_BASE,
    ROTARY_STYLES,
    Kernel,
    Recognized,
    attend,
    softcapped,
)

BEHAVES = "it behaves like"  # how a fitted trap is said


@dataclass(frozen=True)
class Variant:
    """A known wrong way to compute attention, named after its catalogue trap."""

    words: str
    trap: str
    scale: Callable[[int, int], float]  # (d_k, d_model) -> the factor on the scores
    softmax_dim: int = -1
    after_softmax: bool = False
    split_by_view: bool = False  # q, k, v split into heads by view(B, h, T, d), no transpose
    merge_by_view: bool = False  # the heads merged by reshape(B, T, h d), no transpose
    inverted: bool = False  # the mask read the other way: exactly the blocked keys attended
    finite_fill: bool = False  # blocked scores filled with the dtype's lowest, not -inf

    def kernel(self, d_model: int) -> Kernel:
        def attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None) -> Tensor:
            if self.inverted and attn_mask is not None:
                attn_mask = ~attn_mask
            if self.split_by_view:
                q, k, v = (_viewed(t) for t in (q, k, v))
            factor = self.scale(q.size(-1), d_model)
            scores = q @ k.transpose(-2, -1) * (1.0 if self.after_softmax else factor)
            if attn_mask is not None:
                fill = torch.finfo(scores.dtype).min if self.finite_fill else -math.inf
                scores = scores.masked_fill(~attn_mask, fill)
            weights = scores.softmax(dim=self.softmax_dim)  # (B, h, T, T)
            out = (weights * factor if self.after_softmax else weights) @ v  # (B, h, T, d)
            if self.merge_by_view:  # what attend's transpose-then-merge turns into reshape
                B, h, T, d = out.shape
                out = out.reshape(B, T, h, d).transpose(1, 2)
            return out

        return attention


def _viewed(t: Tensor) -> Tensor:
    """(B, h, T, d) heads as ``x.view(B, h, T, d)`` makes them of the (B, T, h d) projection:
    positions and heads mixed (head_split_view)."""
    B, h, T, d = t.shape
    return t.transpose(1, 2).reshape(B, T, h * d).reshape(B, h, T, d)


VARIANTS = (
    Variant("a 1/sqrt(d_model) scale", "scale_d_model", lambda d_k, d: d**-0.5),
    Variant("no scale at all", "missing_scale", lambda d_k, d: 1.0),
    Variant("softmax over the queries", "softmax_dim", lambda d_k, d: d_k**-0.5, softmax_dim=-2),
    # a blocked key is a whole column then: a finite fill spreads it evenly where -inf gives NaN
    Variant("softmax over the queries", "softmax_dim", lambda d_k, d: d_k**-0.5, softmax_dim=-2,
            finite_fill=True),
    Variant("softmax over the batch (F.softmax without dim on (B, T, T) scores)", "softmax_dim",
            lambda d_k, d: d_k**-0.5, softmax_dim=0),
    Variant("softmax over the heads (F.softmax without dim on (B, h, T, T) scores)",
            "softmax_dim", lambda d_k, d: d_k**-0.5, softmax_dim=1),
    Variant("the scale applied after the softmax", "scale_after_softmax", lambda d_k, d: d_k**-0.5,
            after_softmax=True),
    Variant("the scale applied twice (1/d_k)", "double_scale", lambda d_k, d: 1.0 / d_k),
    Variant("heads split by view(B, h, T, d) without the transpose", "head_split_view",
            lambda d_k, d: d_k**-0.5, split_by_view=True),
    Variant("heads merged by reshape(B, T, h * d) without the transpose",
            "head_merge_no_transpose", lambda d_k, d: d_k**-0.5, merge_by_view=True),
    Variant("its mask read the other way round, attending to exactly the keys it blocks (a "
            "keep-mask filled where True, or a blocked-is-True mask given where True attends)",
            "mask_bool or sdpa_mask_inverted", lambda d_k, d: d_k**-0.5, inverted=True),
)  # fmt: skip


def _error(out: Tensor, ref: Tensor, live: Tensor) -> float:
    """Max |out - ref| over the live queries; elsewhere only a NaN or Inf counts (inf), since
    what a module writes for a padded query is its own business, if finite."""
    if out.shape != ref.shape:
        return math.inf
    live = live.to(out.device)
    dead_broken = (~torch.isfinite(out[~live]) & torch.isfinite(ref[~live])).any().item()
    return math.inf if dead_broken else (out - ref)[live].abs().nan_to_num(math.inf).max().item()


def _match_error(out: Tensor, ref: Tensor, live: Tensor) -> float:
    """``_error`` against a known bug's form, where NaN or Inf that the form gives too agree: a
    form that puts NaN where the module does (a softmax over the batch under a causal mask)
    reproduces it."""
    if out.shape != ref.shape:
        return math.inf
    both = ~torch.isfinite(out) & ~torch.isfinite(ref)
    return _error(out.masked_fill(both, 0), ref.masked_fill(both, 0), live)


Key = tuple[int, str | None]  # a reading: (projection reading, rotary style or None)


def _tolerance(subject: Subject, key: Key, x: Tensor, allowed: Tensor | None,
               live: Tensor, bare: bool = False) -> float:  # fmt: skip
    """The float32 noise floor: twice SDPA's own float32 error on these projections (against
    SDPA in float64, both computed here), plus FlashAttention's atol; a module that computes in
    float32 anywhere stays within it. ``bare``: of the attention before the output projection."""
    index, style = key
    exact = subject.readings(subject.copy(torch.float64))[index]
    low = subject.readings(subject.copy(torch.float32))[index]
    if bare:
        exact, low = _without_output(exact), _without_output(low)
    with torch.no_grad():
        dims = subject.rotary_dims
        kernel = _kernel(subject)
        base = subject.rope_base
        ref = attend(exact, x, allowed, kernel, rotary=style, rotary_dims=dims, rotary_base=base)
        ref32 = attend(low, x.float(), allowed, kernel, rotary=style, rotary_dims=dims,
                       rotary_base=base).double()  # fmt: skip
    floor = metrics.Error(_error(ref32, ref, live), 0.0)
    return metrics.threshold(floor, metrics.atol(ref.cpu(), torch.float32), metrics.OUTPUT_FACTOR)


def _without_output(reading: Recognized) -> Recognized:
    """The reading stopped before its output projection: attention's own output (B, T, h d)."""
    qkv, _, heads, described = reading
    return qkv, None, heads, described


@dataclass(frozen=True)
class Inner:
    """What enters the module's output projection ``name`` (B, T, h d), attention's own output,
    with its error against SDPA there and the floor of that error."""

    name: str
    output: Tensor
    error: float
    tolerance: float


def _before_output(
    subject: Subject, reading_copy: nn.Module, key: Key, x: Tensor, keep: Tensor | None,
    allowed: Tensor | None, live: Tensor,
) -> Inner | None:  # fmt: skip
    """Attention's output inside the module, read by a hook on the input of its output
    projection, against SDPA's there; None when the projection is not one module called once.
    A residual, a norm or an activation after that projection is not attention."""
    index, style = key
    reading = subject.readings(reading_copy)[index]
    name = submodule_name(reading_copy, reading[1])
    if name is None:
        return None
    seen = projection_input(subject, subject.copy(), name, x, keep)
    if seen is None:
        return None  # not called, called more than once, or not (B, T, ...): not attention's
    with torch.no_grad():
        strided = subject.kv_grouping == "strided"
        ref = attend(_without_output(reading), x, allowed, _kernel(subject), rotary=style,
                     tile_kv=strided,
                     rotary_dims=subject.rotary_dims, rotary_base=subject.rope_base)  # fmt: skip
    output = seen.double()
    tolerance = _tolerance(subject, key, x, allowed, live, bare=True)
    return Inner(name.removeprefix("mha."), output, _error(output, ref, live), tolerance)


def _nearest(readings: list[Recognized], x: Tensor, allowed: Tensor | None, out: Tensor,
             live: Tensor, tolerance: float, styles: tuple[str | None, ...] = (None,),
             disagreement: float = math.inf, dims: int | None = None,
             base: float = ROPE_BASE, sdpa_style: str | None = None) -> Said:  # fmt: skip
    """The variant the output matches (on any reading of the projections, with any of the
    rotary ``styles``, named where it is not ``sdpa_style``, SDPA's nearest); else the nearest
    one with its distance, when it explains at least half of the ``disagreement`` with SDPA
    (one that does not is no clue, and is not named). An inverted mask is compared on the
    queries it leaves a key."""
    errors = []
    for variant in VARIANTS:
        if variant.inverted and allowed is None:
            continue
        rows = live & (~allowed).any(-1) if variant.inverted else live  # type: ignore[operator]
        for reading in readings:
            for style in styles:
                try:
                    with torch.no_grad():
                        ref = attend(reading, x, allowed, variant.kernel(x.shape[-1]),
                                     rotary=style, rotary_dims=dims,
                                     rotary_base=base)  # fmt: skip
                except RuntimeError:
                    continue  # a reading of other widths
                errors.append((_match_error(out, ref, rows), variant, style))
    err, variant, style = min(errors, key=lambda e: e[0], default=(math.inf, VARIANTS[0], None))
    if err <= tolerance:  # the pairing that matches, which SDPA's nearest need not be
        paired = f" with RoPE ({style})" if style != sdpa_style else ""
        return named(
            f"; {BEHAVES} {variant.words}{paired} (within {err:.2g}): {variant.trap}",
            *variant.trap.split(" or "),
        )
    if not torch.isfinite(out[live.to(out.device)]).all():
        return Said("; its output has NaN or Inf where SDPA's is finite")
    if err > disagreement / 2:
        return Said("; no known trap's arithmetic comes near it")
    return Said(
        f"; no known trap matches (nearest: {variant.words}, {variant.trap}, {err:.3g} off)"
    )


def _references(
    readings: list[Recognized], x: Tensor, allowed: Tensor | None,
    styles: tuple[str | None, ...], tile_kv: bool = False, dims: int | None = None,
    kernel: Kernel = F.scaled_dot_product_attention, base: float = ROPE_BASE,
) -> dict[Key, Tensor]:  # fmt: skip
    """SDPA's output for each reading that runs on ``x`` (a bare weight read the wrong way
    round, a fused layout of other widths do not), by (reading, rotary style); rotary turns
    the first ``dims`` of each head (or all)."""
    refs = {}
    for index, reading in enumerate(readings):
        for style in styles:
            try:
                with torch.no_grad():
                    refs[index, style] = attend(reading, x, allowed, kernel, rotary=style,
                                                tile_kv=tile_kv, rotary_dims=dims,
                                                rotary_base=base)  # fmt: skip
            except RuntimeError:
                continue
    return refs


def _tiled(subject: Subject, readings: list[Recognized], x: Tensor, allowed: Tensor | None,
           out: Tensor, live: Tensor, tolerance: float,
           styles: tuple[str | None, ...]) -> Outcome | None:  # fmt: skip
    """When the module matches SDPA only with its grouped K/V heads tiled (``repeat``): a pass
    noting the strided grouping, or a failure when blocks were declared; None otherwise."""
    declared = subject.kv_grouping
    if declared == "strided":
        return None  # already compared tiled
    tiled = _references(readings, x, allowed, styles, True, subject.rotary_dims, _kernel(subject),
                        subject.rope_base)  # fmt: skip
    if not _matches(tiled, out, live, tolerance):
        return None
    if declared == "blocks":
        return failed(
            "it matches SDPA only with its grouped K/V heads tiled (repeat) instead of each "
            "serving its own block of query heads as repeat_interleave makes them, against "
            "the declared blocks (gqa_kv_grouping)",
            "gqa_kv_grouping",
        )
    return passed(
        f"within {tolerance:.2g} with its grouped K/V heads tiled (repeat: strided grouping, as "
        "x-transformers lays them out; see grouped heads)"
    )


def _kernel(subject: Subject) -> Kernel:
    """The reference kernel: SDPA, or attention with the module's softcap on the scores."""
    if subject.softcap is None:
        return F.scaled_dot_product_attention
    return softcapped(subject.softcap)


def _matches(refs: dict[Key, Tensor], out: Tensor, live: Tensor, tolerance: float) -> bool:
    """Some reference of ``refs`` is within ``tolerance`` of the module's output."""
    return bool(refs) and min(_error(out, ref, live) for ref in refs.values()) <= tolerance


_NOT_COMPARED = (
    "relative positions, and SDPA with standard RoPE (half-split or pairs) on its projections "
    "does not reproduce them (partial or scaled rotary?)"
)


def _other_pairing(subject: Subject, readings: list[Recognized], x: Tensor,
                   allowed: Tensor | None, out: Tensor, live: Tensor,
                   tolerance: float) -> Outcome | None:  # fmt: skip
    """A failure when the module pairs rotary dimensions the other way than declared."""
    declared = subject.config.rope_pairing
    if declared == "auto":
        return None
    others = tuple(s for s in ROTARY_STYLES if s != ROTARY_STYLE[declared])
    refs = _references(readings, x, allowed, others, dims=subject.rotary_dims,
                       kernel=_kernel(subject), base=subject.rope_base)  # fmt: skip
    if _matches(refs, out, live, tolerance):
        return failed(
            f"it pairs rotary dimensions the other way than the declared --rope-pairing "
            f"{declared}: weights laid out for one pairing read with the other "
            "(rope_pairing_mismatch)",
            "rope_pairing_mismatch",
        )
    return None


def _whole_head(subject: Subject, readings: list[Recognized], x: Tensor, allowed: Tensor | None,
                out: Tensor, live: Tensor, tolerance: float,
                styles: tuple[str | None, ...]) -> Outcome | None:  # fmt: skip
    """A failure when a partial rotary module (``rotary_dims``) turns the whole head."""
    dims = subject.rotary_dims
    if dims is None:
        return None
    strided = subject.kv_grouping == "strided"
    refs = _references(readings, x, allowed, styles, strided, kernel=_kernel(subject),
                       base=subject.rope_base)  # fmt: skip
    if _matches(refs, out, live, tolerance):
        return failed(
            f"it turns every dimension of each head, where its rotary covers only the first "
            f"{dims} (--rotary-dims, rotary_ndims or partial_rotary_factor): the dimensions "
            "meant to pass through unrotated are rotated too"
        )
    return None


def _styles(subject: Subject) -> tuple[str, ...]:
    """The rotary pairings to try: the declared one (--rope-pairing), else both."""
    declared = subject.config.rope_pairing
    return (ROTARY_STYLE[declared],) if declared != "auto" else ROTARY_STYLES


def _measured(subject: Subject, why: str) -> Outcome:
    """Where SDPA cannot be run on the module's projections as they are (positions it would not
    add, parameters or buffers beside them): its scale measured from its weights, when they are
    softmax(s q k^T + B) with a bias B of positions alone (``scale.measure``); else skipped for
    ``why``."""
    try:
        found = measure(subject)
    except Exception:  # whatever the module does, the measurement only ever informs
        found = None
    if found is not None:
        return judged(subject, found)
    return skipped(
        f"{why}, and its weights are not softmax(s q k^T + B) with a bias B of positions "
        "alone, whose scale could be measured"
    )


@probe("agrees with SDPA")
def probe_sdpa(subject: Subject) -> Outcome:
    """Agreement with F.scaled_dot_product_attention on the module's own projections."""
    # the doctor made its rotary tables, or the module rotates positions 0..T-1 itself: SDPA with
    # standard RoPE can do the same
    if not subject.deterministic:  # nor can its weights be read off its output
        return skipped("not deterministic in eval mode (see above)")
    rotary = subject.position_scheme == "relative"
    if subject.positional and not rotary:
        return _measured(subject, f"uses positions ({subject.position_source}): SDPA would not")
    if subject.sinks:
        return skipped(
            f"attention sinks (`{subject.sinks}`: one more logit per head in each softmax, as "
            "gpt-oss's): SDPA takes none, so it is not compared"
        )
    module = subject.copy()  # float64, or float32 for a module that runs only in float32
    reading_copy = subject.copy(torch.float64)  # the reference is float64 either way
    readings = subject.readings(reading_copy)
    if not readings:
        return _measured(subject, "projections not recognized (or other parameters or non-mask "
                         "buffers present)")  # fmt: skip
    cfg = subject.config
    keep = subject.ordinary_keep(cfg.batch, cfg.seq_len)
    allowed = subject.effective_keep(keep, cfg.batch, cfg.seq_len)
    # under a (B, T, T) mask the ordinary one is the doctor's causal mask: not the module's own
    ours = subject.takes_mask and cfg.mask_shape not in KEY_LAYOUTS
    undeclared = not cfg.causal and not ours and subject.masks_future
    if undeclared:  # SDPA is causal too, so that it compares what the module computes
        causal = causal_keep(cfg.batch, cfg.seq_len)
        allowed = causal if allowed is None else allowed & causal
    live = live_queries(allowed, cfg.batch, cfg.seq_len)
    x = subject.x(cfg.batch, cfg.seq_len, 8)
    with torch.no_grad():
        out = subject.call(module, x, keep)[0].double()
    x = x.double()
    styles = _styles(subject) if rotary else (None,)
    strided = subject.kv_grouping == "strided"
    refs = _references(readings, x, allowed, styles, strided, subject.rotary_dims,
                       _kernel(subject), subject.rope_base)  # fmt: skip
    if not refs:
        return skipped("projections recognized, but no reading of them runs on this input")
    best, ref = min(refs.items(), key=lambda item: _error(out, item[1], live))
    turned = f" on {subject.rotary_dims} dims a head" if subject.rotary_dims else ""
    capped = f", scores capped at {subject.softcap:g}" if subject.softcap else ""
    described = readings[best[0]][3] + (f", RoPE ({best[1]}{turned})" if rotary else "") + capped
    if undeclared:
        said = declared(subject.original)
        against = f", though {said[1]}" if said and not said[0] else "; --causal says so"
        described += f", causal (it masks the future by itself{against})"
    if out.shape != ref.shape:
        return failed(f"output {tuple(out.shape)} vs SDPA's {tuple(ref.shape)} on {described}")
    error = _error(out, ref, live)
    tolerance = _tolerance(subject, best, x, allowed, live)
    if error > tolerance and (found := _tiled(subject, readings, x, allowed, out, live,
                                              tolerance, styles)):  # fmt: skip
        return found
    inner = None
    if error > tolerance:
        inner = _before_output(subject, reading_copy, best, x, keep, allowed, live)
    if inner is not None and inner.error <= inner.tolerance:
        return passed(
            f"within {inner.tolerance:.2g} (the float32 floor) at the input of its output "
            f"projection `{inner.name}`, which is attention's output; what it does after that "
            "projection (a residual, a norm) is not attention and is not compared"
        )
    if error <= tolerance:
        return passed(f"within {tolerance:.2g} (the float32 floor) on {described}")
    # the known wrong forms are of the usual scale: fitted on the projections as they are, on
    # attention's own output where it can be read
    every = subject.recognized(subject.copy(torch.float64))
    as_is = [every[best[0]], *(r for i, r in enumerate(every) if i != best[0])]  # best first
    if inner is not None:
        out, error, tolerance = inner.output, inner.error, inner.tolerance
        as_is = [_without_output(r) for r in as_is]
        readings = [_without_output(r) for r in readings]
        described += f", read at the input of `{inner.name}`"
    nearest = _nearest(as_is, x, allowed, out, live, tolerance, styles, error,
                       subject.rotary_dims, subject.rope_base, best[1])  # fmt: skip
    if subject.softcap and BEHAVES not in nearest.text:
        after = softcapped(subject.softcap, after_mask=True)
        if _matches(_references(readings, x, allowed, styles, strided, subject.rotary_dims,
                                after, subject.rope_base), out, live, tolerance):  # fmt: skip
            nearest = named(f"; {BEHAVES} its softcap applied after the mask, which squashes "
                            f"the mask to -{subject.softcap:g}: softcap_after_mask",
                            "softcap_after_mask")  # fmt: skip
    if rotary and BEHAVES not in nearest.text:
        return (
            _other_pairing(subject, readings, x, allowed, out, live, tolerance)
            or _whole_head(subject, readings, x, allowed, out, live, tolerance, styles)
            or _measured(subject, _NOT_COMPARED)
        )
    return failed(
        f"max |output - SDPA| = {error:.3g} on {described} (float32 floor {tolerance:.2g})"
        + nearest
    )
