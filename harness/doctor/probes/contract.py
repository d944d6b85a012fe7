"""The contract of self-attention: shapes, batch independence, permutation equivariance,
weights that are distributions, and gradient flow to every parameter."""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace

import torch

from harness import metrics
from harness.doctor.causality import declared
from harness.doctor.config import float32_rounding
from harness.doctor.findings import Outcome, Said, failed, named, passed, skipped, warned
from harness.doctor.probes.registry import probe
from harness.doctor.subject import Subject
from harness.inputs import generator
from harness.reference import attention_weights, head_count
from harness.runner import describe

EXACT = 1e-9  # float64: differences below this are rounding


def _shape_cases(subject: Subject) -> list[tuple[str, int, int]]:
    cfg = subject.config
    head_width = max(1, subject.d_model // head_count(subject.module))
    cases = [
        ("ordinary", cfg.batch, cfg.seq_len),
        ("batch == seq_len", 3, 3),
        ("seq_len == head width", 2, head_width),
        ("seq_len == d_model", 2, subject.d_model),
        ("seq_len 1", 2, 1),
        ("batch 1", 1, 5),
    ]
    if subject.fixed_length is not None:  # it takes one length only
        return [case for case in cases if case[2] == subject.fixed_length]
    context = subject.context or math.inf  # never beyond the context the module declares
    return [case for case in cases if case[2] <= context]


def _longest(subject: Subject, seq_len: int) -> int | None:
    """The longest sequence the module runs on, where ``seq_len``, past the probes' own length,
    is past it and every length up to it runs (the lengths halved down to the probes' run);
    None where a shorter length fails too: that is no limit of length."""
    ordinary = subject.config.seq_len
    if seq_len <= ordinary or subject.runs(seq_len):
        return None
    low, high = ordinary, seq_len  # runs at low, not at high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if subject.runs(middle) else (low, middle)
    return low if all(subject.runs(n) for n in range(ordinary, low + 1, max(1, low // 8))) else None


@probe("shape contract")
def probe_shapes(subject: Subject) -> Outcome:
    """Output (B, T, d) and weights (B, [h,] T, T) on awkward shapes; a shape the module or its
    adapter says it does not take (a model that cannot make that many tokens) is left out."""
    width, untaken = None, []
    for label, batch, seq_len in _shape_cases(subject):
        module = subject.copy()
        try:
            with torch.no_grad():
                out, weights = subject.call(
                    module, subject.x(batch, seq_len, 1), subject.ordinary_keep(batch, seq_len)
                )
        except NotImplementedError as exc:
            untaken.append(f"{label}: {describe(exc)}")
            continue
        except Exception as exc:
            longest = _longest(subject, seq_len)
            if longest is not None:  # a length past what it takes: a table of N positions
                untaken.append(f"{label}: it runs on up to {longest} tokens, and raises on "
                               f"{seq_len}: {describe(exc)}")  # fmt: skip
                continue
            return failed(
                f"raises on {label} (B={batch} T={seq_len}): {describe(exc)}",
            )
        if out.dim() != 3 or tuple(out.shape[:2]) != (batch, seq_len):
            return failed(
                f"on {label} (B={batch} T={seq_len}) output shape is "
                f"{tuple(out.shape)}, expected ({batch}, {seq_len}, d)",
            )
        if width is not None and out.shape[-1] != width:
            return failed(
                f"output width {out.shape[-1]} on {label}, {width} elsewhere",
            )
        width = out.shape[-1]
        if weights is not None and (
            weights.shape[-2:] != (seq_len, seq_len)
            or weights.shape[0] != batch
            or weights.dim() not in (3, 4)
        ):
            return failed(
                f"on {label} (B={batch} T={seq_len}) weights shape is "
                f"{tuple(weights.shape)}, expected ({batch}, [h,] {seq_len}, {seq_len})",
            )
    labels = [label for label, _, _ in _shape_cases(subject)[1:]]
    beyond = "" if subject.context is None else f" (up to its context, {subject.context})"
    beyond += "".join(f"; not taken: {said}" for said in untaken)
    if subject.fixed_length is not None:
        beyond = f" (only at {subject.fixed_length} tokens: {subject.length_source})"
    if subject.config.seq_len < subject.asked_seq_len:
        beyond += (f"; every probe runs at seq_len {subject.config.seq_len} instead of "
                   f"{subject.asked_seq_len}, within it")  # fmt: skip
    return passed((", ".join(labels) + beyond).strip())


@probe("batch independence")
def probe_batch_independence(subject: Subject) -> Outcome:
    """The loss on sequence 0 gives zero gradient to every other sequence (Karpathy's check)."""
    mixing = _mixing(subject)
    if mixing is None:
        return passed("sequence 0's loss and the last one's: zero gradient to the others")
    packed = _packed(subject)
    if packed:
        return failed(mixing + packed)
    if not subject.sequence_first:
        turned = Subject(subject.module, replace(subject.config, sequence_first=True))
        with contextlib.suppress(Exception):
            if _mixing(turned) is None:
                mixing += (
                    "; read sequence-first, as (T, B, d), it mixes nothing: if that is its "
                    "layout, pass --sequence-first"
                )
    return failed(mixing)


def _mixing(subject: Subject) -> str | None:
    """Evidence that sequence 0's output, or the last one's, depends on another sequence (the
    last, for sequences packed into one causal row: each reads those before it; a NaN it
    sends back is no such evidence, and sequence 0's says so already), or None."""
    batch = seq_len = 3  # batch == seq_len: wrong-axis bugs run here instead of raising
    seq_len = subject.fixed_length or seq_len
    x = subject.x(batch, seq_len, 2)
    keep = subject.ordinary_keep(batch, seq_len)
    for own in (0, batch - 1):
        grad = subject.grad_of(x, keep, lambda out, own=own: out[own])
        norms = grad.flatten(1).norm(dim=1)  # (B,)
        others = [b for b in range(batch) if b != own]
        if own == 0 and norms[others].isnan().any():  # (the last: finite mixing only)
            b = next(b for b in others if norms[b].isnan())
            return (
                f"sequence {own}'s loss sends a NaN gradient to sequence {b}: a NaN in the "
                "forward pass leaks backwards (no proof of mixing; see the other probes)"
            )
        if (norms[others] > 0).any():
            b = max(others, key=lambda b: norms[b].item())
            return (
                f"output of sequence {own} depends on sequence {b}: "
                f"gradient norm {norms[b].item():.3g}"
            )
    return None


def _packed(subject: Subject) -> Said:
    """Where the recorded forward attends the batch's sequences as one row of them all (a
    packed batch, as varlen kernels take it): sequences that read each other there are
    documents not kept apart, at the mask that should have kept them (or the softmax)."""
    cfg, reading = subject.config, subject.reading
    weights = reading.weights
    rows = cfg.batch * cfg.seq_len
    if weights is None or cfg.batch < 2 or weights.dim() < 2 or weights.shape[-2] != rows:
        return Said("")
    lines = [f.line for name in ("mask", "attention") for f in reading.facts
             if f.name == name and f.line]  # fmt: skip
    where = lines[0] if lines else ""
    said = (f": the recorded forward attends the {cfg.batch} sequences as one row of {rows} "
            "(a packed batch), and a sequence reads the one packed before it "
            "(packing_cross_document: block the keys of other documents, a block-diagonal "
            "mask of their lengths)")  # fmt: skip
    why = f"the {cfg.batch} sequences attend as one row of {rows}, not one block each"
    return Said(said, ("packing_cross_document",), where, why)


@probe("permutation equivariance")
def probe_permutation(subject: Subject) -> Outcome:
    """Permuting the positions permutes the output, when positions are not used."""
    cfg = subject.config
    if cfg.causal:
        return skipped("causal: a later token moved changes what earlier ones see")
    if subject.positional:
        return skipped(f"it uses positions ({subject.position_source})")
    if not subject.deterministic:
        return skipped("not deterministic in eval mode (above)")
    module = subject.copy()
    x = subject.x(cfg.batch, cfg.seq_len, 5)
    perm = torch.randperm(cfg.seq_len, generator=generator(5))
    keep = subject.keep("padding", cfg.batch, cfg.seq_len, 5) if subject.takes_mask else None
    keep_perm = None if keep is None else keep[:, perm][:, :, perm]
    with torch.no_grad():
        out, _ = subject.call(module, x, keep)
        out_perm, _ = subject.call(module, x[:, perm], keep_perm)
    diff = (out[:, perm] - out_perm).abs().nan_to_num(math.inf).max().item()
    if diff > float32_rounding(out.abs().nan_to_num(0).max().item()):
        return failed(
            f"permuting the positions changes more than their order: max |diff| {diff:.3g}; "
            + _order_hint(subject)
        )
    return passed("permuted input, permuted output")


def _order_hint(subject: Subject) -> str:
    """Why a module may not be permutation equivariant, without pointing to a flag that would
    hide a failure: a module that never looks ahead is told about --causal (which runs the
    causal probes), one that does is shown the evidence before --positions is offered."""
    try:  # with no mask passed: does the module itself keep outputs from looking ahead?
        leak = subject.leak_by_itself
    except Exception:
        return (
            "if it uses positions on purpose, pass --positions relative or absolute; if it is "
            "causal, --causal"
        )
    if leak is None:
        said = declared(subject.original)
        if said is not None and not said[0]:  # an encoder's layer, in its own words
            return (
                f"no output depends on a later input, though {said[1]}: a bidirectional layer "
                "that masks the future; drop its causal mask (if it is meant to be causal, its "
                "flag should say so, or pass --causal)"
            )
        return "no output depends on a later input: if it masks the future, pass --causal"
    return (
        f"{leak}: if it is meant to be causal, that is a future leak (pass --causal to probe "
        "it); if it uses positions on purpose, pass --positions relative (rotary, ALiBi) or "
        "absolute (learned, sinusoidal)"
    )


@probe("attention weights")
def probe_weights(subject: Subject) -> Outcome:
    """Returned weights: non-negative rows summing to 1, zero where masked, not saturated."""
    cfg = subject.config
    module = subject.copy()
    keep = subject.ordinary_keep(cfg.batch, cfg.seq_len)
    with torch.no_grad():
        _, weights = subject.call(module, subject.x(cfg.batch, cfg.seq_len, 6), keep)
    if weights is None:
        return _saturation_of_projections(subject, keep)
    w = weights.double().cpu()
    allowed = subject.effective_keep(keep, cfg.batch, cfg.seq_len)
    if allowed is not None and w.dim() == 4:
        allowed = allowed[:, None]
    if allowed is not None:
        allowed = allowed.expand_as(w)
        live = allowed.any(-1)
    else:
        live = torch.ones(w.shape[:-1], dtype=torch.bool)
    rows = w[live]
    if not torch.isfinite(rows).all():
        return failed("NaN or Inf in rows that have allowed keys" + _other_axis(w, allowed))
    sums = rows.sum(-1)
    # with attention sinks the sink takes the rest of each row: a row sums to at most 1
    off = (sums - 1).clamp(min=0) if subject.sinks else (sums - 1).abs()
    row_err = off.max().item() if rows.numel() else 0.0
    if row_err > 1e-6 or (rows < 0).any():
        return failed(
            f"rows are not distributions: max |row sum - 1| = {row_err:.3g}"
            + _other_axis(w, allowed),
        )
    if allowed is not None:
        # rows with no allowed key (a padded query whose window holds only padding) are
        # the all-masked rows probe's: uniform weights there are one sound answer
        dead = w.masked_fill(allowed, 0).nan_to_num(0)
        leaked = dead[live].abs().max().item() if live.any() else 0.0
        if leaked > EXACT:
            flattened = _flattened(w, allowed, live, subject.softcap)
            why = flattened or _window_edge(dead, subject.window) or _future(dead, cfg.causal)
            return failed(f"weight {leaked:.3g} on a masked key" + why)
    saturated = metrics.saturated_fraction(rows) if rows.numel() else 0.0
    if metrics.degenerate(saturated):
        return failed(_saturated(saturated))
    return passed("rows sum to 1, zero where masked, not saturated")


def _window_edge(dead: torch.Tensor, window: int | None) -> Said:
    """sliding_window_off_by_one, when a windowed module's weight on masked keys lies only on
    the key just before its window (key t - w for query t): it holds w + 1 keys. Else nothing."""
    T = dead.shape[-1]
    if window is None or dead.shape[-2] != T or window >= T:
        return Said("")
    ago = torch.arange(T)[:, None] - torch.arange(T)[None, :]  # (T, T): how far back
    weighted = dead.abs().gt(EXACT)
    if not bool((weighted & (ago == window)).any()) or bool((weighted & (ago != window)).any()):
        return Said("")
    return named(
        f", only on the key just before its window of {window}: it holds {window + 1} keys "
        "(sliding_window_off_by_one: keep keys t - w < s <= t)",
        "sliding_window_off_by_one",
    )


def _future(dead: torch.Tensor, causal: bool) -> Said:
    """Where a causal module's weight on masked keys lies on later keys: the leak named."""
    if not causal:
        return Said("")
    T = dead.shape[-1]
    later = torch.ones(T, T, dtype=torch.bool).triu(1)  # (T, T): key after query
    if dead.shape[-2] != T or not (dead.abs() * later).gt(EXACT).any():
        return Said("")
    return named(", a later one: the future is not masked (causal_leak)", "causal_leak")


def _flattened(
    w: torch.Tensor, allowed: torch.Tensor, live: torch.Tensor, cap: float | None
) -> Said:
    """softcap_after_mask, when every masked key of a row has one and the same weight while the
    allowed keys' weights differ: the mask's fill was squashed to one finite logit after it was
    added (tanh capping turns any fill into -cap); a mask dropped or built wrong leaves masked
    keys their own scores. Else nothing."""
    masked = ~allowed & live[..., None]  # (..., T, S): masked keys of rows that have a key
    rows = masked.sum(-1) >= 2  # rows whose masked keys can be compared
    if not rows.any():
        return Said("")
    inf = torch.tensor(float("inf"), dtype=w.dtype)
    highest = w.where(masked, -inf).amax(-1)[rows]
    lowest = w.where(masked, inf).amin(-1)[rows]
    spread = w.where(allowed, -inf).amax(-1) - w.where(allowed, inf).amin(-1)
    alike = bool(((highest - lowest) <= 1e-6 * highest).all() and (lowest > EXACT).all())
    if not alike or not bool((spread[rows] > 1e-6).any()):
        return Said("")
    to = f" -{cap:g}" if cap else " one finite logit"
    return named(
        f"; every masked key of a row gets the same weight: the mask's fill was squashed to{to} "
        "after it was added, as capping the scores after the mask does: softcap_after_mask "
        "(cap the scores, then mask them)",
        "softcap_after_mask",
    )


# The axes a softmax without the right dim normalizes instead: by what sums to 1 along them.
OTHER_AXES = ((-2, "the queries (dim=-2)"), (0, "the batch (F.softmax without dim on 3-D scores)"),
              (1, "the heads (F.softmax without dim on 4-D scores)"))  # fmt: skip


def _other_axis(w: torch.Tensor, allowed: torch.Tensor | None) -> Said:
    """softmax_dim, when the weights are distributions along another axis (NaN where every
    entry along it is masked, as the tutorial's causal mask makes them); else nothing."""
    blocked = torch.zeros_like(w, dtype=torch.bool) if allowed is None else ~allowed
    for axis, words in OTHER_AXES:
        if w.dim() == 3 and axis == 1:
            continue
        sums = w.nan_to_num(0.0).sum(axis)
        none_left = blocked.all(axis)  # entries whose whole slice along the axis is masked
        fine = ((sums - 1).abs() <= 1e-6) | none_left
        nan_where_blocked = bool((w.isnan() <= blocked.all(axis, keepdim=True)).all())
        if bool(fine.all()) and nan_where_blocked:
            return named(
                f"; they sum to 1 over {words} instead: softmax_dim (softmax(dim=-1))",
                "softmax_dim",
            )
    return Said("")


def _saturated(fraction: float, where: str = "") -> Said:
    return named(
        f"{fraction:.0%} of rows put >= {metrics.SATURATED:g} of their weight on one key at "
        f"initialisation{where}: projection weights too large for the scale, init_unit_variance "
        "(nn.Linear's default or xavier init, not normal_(std=1))",
        "init_unit_variance",
    )


def _saturation_of_projections(subject: Subject, keep: torch.Tensor | None) -> Outcome:
    """A module that returns no weights: the weights its own projections give, when recognized,
    are read for saturation (a too-large init shows there); else nothing to check."""
    cfg = subject.config
    readings = subject.readings(subject.copy())
    if not readings:
        return _saturation_recorded(subject)
    allowed = subject.effective_keep(keep, cfg.batch, cfg.seq_len)
    x = subject.x(cfg.batch, cfg.seq_len, 6)
    try:
        with torch.no_grad():
            w = attention_weights(readings[0], x, allowed).cpu()
    except RuntimeError:
        return skipped("forward returns no weights (its projections do not run alone)")
    return _rows_judged(w, "its projections' weights", "read off its projections")


def _saturation_recorded(subject: Subject) -> Outcome:
    """A module that returns no weights and whose projections are not read alone (a gate
    beside them, a bias of positions): the weights its softmax computed in the recorded
    forward are read for saturation instead; else nothing to check."""
    w = subject.reading.weights
    if w is None:
        return skipped("forward returns no weights (and its projections are not recognized)")
    return _rows_judged(w, "its softmax's in the recorded forward", "read off its softmax in "
                        "the recorded forward")  # fmt: skip


def _rows_judged(w: torch.Tensor, whose: str, how: str) -> Outcome:
    """Weights (keys last) that a module does not return, read elsewhere (``how``): a
    failure where most finite rows saturate, else a skip that says how many did."""
    rows = w.reshape(-1, w.shape[-1]).double().cpu()
    rows = rows[torch.isfinite(rows).all(-1)]
    saturated = metrics.saturated_fraction(rows) if rows.numel() else 0.0
    if metrics.degenerate(saturated):
        return failed(_saturated(saturated, f" ({how}: it returns no weights)"))
    return skipped(f"forward returns no weights; {whose}: {saturated:.0%} of rows saturated")


def _unused(subject: Subject, unused: list[str]) -> Outcome:
    """No gradient reaches ``unused`` through the output: a failure, unless the call is the
    model doctor's replay (``unused_by_model``), which says how the model itself uses them:
    through another output of the layer (a bias returned apart, added by the block: it
    passes), or not at all as called (a warning: an input or a length this run does not
    give)."""
    by_model = subject.adapter.unused_by_model
    if by_model is None:
        return failed(f"no gradient reaches {', '.join(unused)} (unused?)")
    idle = [n for n in unused if n in by_model]
    elsewhere = [n for n in unused if n not in by_model]
    said = (f"{', '.join(elsewhere)}: no gradient through the layer's output, but through "
            "another output its model uses; " if elsewhere else "")  # fmt: skip
    if idle:
        return warned(f"{said}no gradient reaches {', '.join(idle)}, in the model's own "
                      "forward either: unused by the model as called")  # fmt: skip
    return passed(said.rstrip("; "))


@probe("gradient flow")
def probe_gradients(subject: Subject) -> Outcome:
    """Every parameter gets a gradient; exactly-zero ones are dead weight (a warning)."""
    cfg = subject.config
    module = subject.copy()
    x = subject.x(cfg.batch, cfg.seq_len, 11)
    out, _ = subject.call(module, x, subject.ordinary_keep(cfg.batch, cfg.seq_len))
    G = torch.randn(out.shape, generator=generator(11), dtype=out.dtype).to(out.device)
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    if not named:
        return skipped("no trainable parameters")
    grads = torch.autograd.grad((out * G).sum(), [p for _, p in named], allow_unused=True)
    norms = {
        n: (math.nan if g is None else g.norm().item())
        for (n, _), g in zip(named, grads, strict=True)
    }
    unused = [n for n, g in zip(norms, grads, strict=True) if g is None]
    if unused:
        return _unused(subject, unused)
    broken = [n for n, v in norms.items() if not math.isfinite(v)]
    if broken:
        return failed(f"the gradient of {', '.join(broken)} is NaN or infinite on ordinary inputs")
    typical = max(norms.values())
    dead = [n for n, v in norms.items() if v <= 1e-9 * typical]
    # a key projection's bias adds q . b_k to every score of a row, which softmax takes away:
    # no gradient is what correct attention gives it. It shows as a dead bias beside a live
    # weight (an unused layer has both dead)
    key_biases = [n for n in dead if _cancelled_bias(n, dead, norms)]
    others = [n for n in dead if n not in key_biases]
    if others:
        return warned(
            f"dead weight: {', '.join(others)} gets no gradient (norm "
            f"{max(norms[n] for n in others):.2g} against {typical:.3g})",
        )
    if key_biases:
        return passed(
            f"all {len(norms)} parameters get a gradient but {', '.join(key_biases)}, a key "
            "bias, which softmax ignores (it shifts every score of a row alike), as it should"
        )
    return passed(f"all {len(norms)} parameters get a gradient")


def _cancelled_bias(name: str, dead: list[str], norms: dict[str, float]) -> bool:
    """``name`` is a layer's bias, dead, while the layer's weight gets a gradient: a bias that
    the softmax cancels (a key projection's), not a layer left unused."""
    layer, _, last = name.rpartition(".")
    weight = f"{layer}.weight" if layer else "weight"
    return last == "bias" and weight in norms and weight not in dead
