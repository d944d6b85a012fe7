"""One reading of a module: the facts its recorded forward shows, each with its source line,
and the traps those facts name.

A fact is what ran ("softmax over axis 1 of the (2, 8, 8) scores, the queries' axis, at
attn.py:34"), not what a name suggests. The doctor prints the facts it went on; a trap named
from a fact is printed first, at its line, above the failures it explains. Which facts fail a
module by themselves is ``harness.doctor.reading.checks``'s to say; the others only name the
cause of a failure a probe measured.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from harness.doctor.reading.attention import LAST_AXIS, Factor, Site, sites
from harness.doctor.reading.groups import grouping, shared_heads
from harness.doctor.reading.known import COMPUTED, DECLARED, Fact, Named, Reading
from harness.doctor.reading.located import (
    angles_made,
    dropout_left_on,
    finite_fill,
    naive_softmax,
    outgrown_at,
    tilings,
)
from harness.doctor.reading.mask_cells import (
    fills_kept_cells,
    sdpa_mask,
    turned_given,
    unread_mask,
    zero_one,
)
from harness.doctor.reading.ops import DIVIDE, MULTIPLY
from harness.doctor.reading.pairing import DECLARED as PAIRINGS
from harness.doctor.reading.raised import heads_before_positions, keys_transposed
from harness.doctor.reading.record import Record

CLOSE = 1e-3  # relative: a scale this close to a named one is that one
FACTORS = MULTIPLY | DIVIDE
# torch calls that compute a whole attention inside them (nn.MultiheadAttention's)
FUSED = {"multi_head_attention_forward", "_native_multi_head_attention"}


def _axis_word(site: Site, axis: int) -> str:
    if axis == site.key_axis:
        return "the keys' axis"
    if axis == site.query_axis:
        return "the queries' axis"
    return "neither the keys' nor the queries' axis (heads or batch)"


def _shape(site: Site) -> str:
    """The scores' shape: the softmax's input, or for SDPA (B, h, T, S) from its q and k."""
    op = site.softmax
    first = op.arg(0, "query") if site.sdpa else op.args[0] if op.args else None
    if first is None or not first.shape:
        return "?"
    shape = first.shape
    key = op.arg(1, "key")
    if site.sdpa and key is not None and key.shape:
        shape = (*shape[:-1], key.shape[-2])
    return "x".join(map(str, shape))


def _near(a: float, b: float) -> bool:
    """Equal within the reading's relative tolerance."""
    return abs(a - b) <= CLOSE * abs(b)


def _scale_name(scale: float, width: int, d_model: int, factors: list[float]) -> str | None:
    """The trap a wrong scale is, by its value against the head width and the model width;
    two ``factors`` of 1/sqrt(head width) each are the scale applied twice, whatever the
    model width (1/sqrt(d_model) is also 1/width where d_model is width squared)."""
    if _near(scale, 1 / math.sqrt(width)):
        return None
    if _near(scale, 1.0):
        return "missing_scale"
    if len(factors) == 2 and all(_near(f, 1 / math.sqrt(width)) for f in factors):
        return "double_scale"
    if d_model != width and _near(scale, 1 / math.sqrt(d_model)):
        return "scale_d_model"
    if _near(scale, 1 / width):
        return "double_scale"
    return "wrong_scale"


def _made(site: Site, made: Callable[[str], str]) -> tuple[str, str]:
    """Where a tensor that holds a scale factor was made, when the doctor watched it built:
    the words and the line ("" and "" when not)."""
    for factor in site.factors:
        given = factor.given
        if given is not None and given.kind in ("attribute", "buffer") and given.ref:
            line = made(str(given.ref))
            if line:
                return f"; self.{str(given.ref).rsplit('.', 1)[-1]} is made at {line}", line
    return "", ""


SCALES = ("missing_scale", "scale_d_model", "double_scale", "wrong_scale")  # a probe may fit


def _uncancelled(factors: list[Factor]) -> list[Factor]:
    """The factors left once each pair that undoes itself is taken out: a soft-cap's division
    by the cap before its tanh and multiplication by it after scale nothing."""
    left = list(factors)
    for factor in factors:
        if factor not in left:
            continue
        partner = next(
            (g for g in left if g is not factor and math.isclose(factor.value * g.value, 1.0)),
            None,
        )
        if partner is not None:
            left.remove(factor)
            left.remove(partner)
    return left


def _against_declared(
    site: Site, declared: float, line: str, applied: list[Factor], d_model: int
) -> list[Named]:
    """The scale the forward applies, where the user declared another (T5's 1): the declared
    one times 1/sqrt(head width) is the scale applied on top of it (double_scale), and
    1/sqrt(model width) where that is not the head's, the model's (scale_d_model)."""
    if not (site.complete and site.width) or site.after_softmax:
        return []
    if math.isclose(site.scale, declared, rel_tol=1e-4):
        return []
    twice = math.isclose(site.scale, declared / math.sqrt(site.width), rel_tol=1e-4)
    model = d_model != site.width and math.isclose(site.scale, d_model**-0.5, rel_tol=1e-4)
    said = f"the scores are scaled by {site.scale:.6g}, where the declared scale is {declared:.6g}"
    trap = (
        "double_scale" if twice else "scale_d_model" if model
        else "wrong_scale" if applied else "missing_scale"
    )  # fmt: skip
    return [Named(trap, said, line)]


def _turned_apart(site: Site, declared: str) -> list[Named]:
    """The queries and keys rotated in different pairings, named at the rotation of the one
    that is not in the declared pairing (``--rope-pairing``; where none is declared, which of
    the two the weights were trained for is not the record's to say)."""
    turns = {role: turn for role, (_, turn) in site.turns.items() if turn is not None}
    if len(turns) != 2 or len(set(turns.values())) != 2 or declared not in PAIRINGS:
        return []
    wrong = next((role for role, turn in turns.items() if turn != PAIRINGS[declared]), None)
    if wrong is None:
        return []
    right = "keys" if wrong == "queries" else "queries"
    op, other = site.turns[wrong][0], site.turns[right][0]
    said = (f"the {wrong} are turned in {turns[wrong]} of their dimensions as projected, the "
            f"{right} in {turns[right]}, as declared: the {wrong}' weights are read in a "
            "layout made for the other pairing")  # fmt: skip
    return [Named("rope_pairing_mismatch", said, op.called_where, (other.called_where,))]


def site_facts(
    site: Site,
    d_model: int,
    declared_scale: float | None,
    made: Callable[[str], str],
    causal: bool = False,
    mixable: bool = False,
    declared_pairing: str = "auto",
) -> Reading:
    """The facts of one attention site, and the traps they name; ``made(name)``: where the
    module's tensor ``name`` was made ("" when not known); ``mixable``: the caller's mask
    blocked nothing in the first sequence, so a mask joined to it is read as the module's
    there; ``declared_pairing``: the rotary pairing the user declared."""
    reading = Reading(attention_found=True)
    facts, named = reading.facts, reading.named
    line = site.softmax.where
    kind = "SDPA" if site.sdpa else "softmax"
    facts.append(Fact("attention", f"{kind} of scores {_shape(site)}", COMPUTED, line))
    if site.key_axis is not None:
        facts.append(Fact("keys' axis", f"{site.key_axis} ({site.key_axis_from})"))
    if site.query_axis is not None:
        facts.append(Fact("queries' axis", str(site.query_axis), COMPUTED))
    if not site.sdpa and site.softmax_axis is not None and site.key_axis is not None:
        over = _axis_word(site, site.softmax_axis)
        facts.append(Fact("softmax axis", f"{site.softmax_axis}: {over}", COMPUTED, line))
        if site.softmax_axis != site.key_axis and site.key_axis_from != LAST_AXIS:
            named.append(Named("softmax_dim", f"the softmax normalizes axis {site.softmax_axis} "
                               f"({over}) of the scores; the keys are on axis {site.key_axis}",
                               line))  # fmt: skip
    if site.width:
        facts.append(Fact("head width", str(site.width), COMPUTED,
                          site.product.where if site.product else line))  # fmt: skip
    product_line = site.product.where if site.product is not None else line
    applied = _uncancelled([f for f in site.factors if f.where != "weights" and f.value != 1.0])
    # nearest the softmax, a factor a line writes before SDPA's own default
    written = [f for f in applied if not f.implicit] or applied
    scale_line = written[0].op.where if written else product_line
    if declared_scale is not None:
        facts.append(Fact("scale", f"{declared_scale:.6g}", DECLARED))
        named.extend(_against_declared(site, declared_scale, scale_line, applied, d_model))
    elif site.complete and site.width:
        where = ", ".join(sorted({f.where for f in applied}))
        said = f"{site.scale:.6g}" + (f" (on the {where})" if where else " (none applied)")
        facts.append(Fact("scale", said, COMPUTED, scale_line))
        trap = _scale_name(site.scale, site.width, d_model, [f.value for f in applied])
        if trap is not None and not site.after_softmax:  # else: the scale is misplaced (below)
            expected = 1 / math.sqrt(site.width)
            each = (
                "; ".join(f"{f.value:.6g} at {f.op.line}" for f in applied)
                if len(applied) > 1
                else ""
            )
            words, made_at = _made(site, made)
            also = tuple(dict.fromkeys(f.op.where for f in applied if f.op.where != scale_line))
            named.append(Named(trap, f"the scores are scaled by {site.scale:.6g}"
                               + (f" ({each})" if each else "")
                               + f"; 1/sqrt(head width {site.width}) is {expected:.6g}{words}",
                               scale_line, also + ((made_at,) if made_at else ())))  # fmt: skip
    elif site.stopped_at is not None:
        stop = site.stopped_at.name
        why = ": a factor of more than one number, per head or learned" if stop in FACTORS else ""
        facts.append(Fact("scale", "not read: the scores or their operands pass through an op "
                          f"it does not follow ({stop}{why})", COMPUTED,
                          site.stopped_at.where))  # fmt: skip
        also = tuple(dict.fromkeys(f.op.where for f in applied if f.op.where != scale_line))
        said = "the scale is applied here (the rest of the scores' factors were not read)"
        named.extend(Named(trap, said, scale_line, also, located=True) for trap in SCALES)
    for factor in site.after_softmax:
        facts.append(Fact("factor after the softmax", f"{factor.value:.6g}", COMPUTED,
                          factor.op.where))  # fmt: skip
        named.append(Named("scale_after_softmax", f"the weights are multiplied by "
                           f"{factor.value:.6g} after the softmax", factor.op.where))  # fmt: skip
    if site.rotated is not None:
        rotated = "the queries or keys are turned by position (times tables of angles)"
        facts.append(Fact("rotary", rotated, COMPUTED, site.rotated.where))
    if site.turned_before is not None:  # absolute positions, by rotation (Wav2Vec2-Conformer)
        turned = "the input is turned by position before it is projected to queries or keys"
        facts.append(Fact("rotary before the projections", turned, COMPUTED,
                          site.turned_before.called_where))  # fmt: skip
    if site.values_rotated is not None:
        where = site.values_rotated.called_where  # the line that hands v to the rotation
        facts.append(Fact("rotary on the values", "the values are rotated too", COMPUTED, where))
        named.append(Named("rope_on_value", "the values are rotated by position as the queries "
                           "and keys are: rotary belongs on q and k only, where the turns cancel "
                           "in q k^T; on v they stay in the output", where))  # fmt: skip
    for fill in site.fills:
        value = "added" if fill.value is None else f"filled with {fill.value:g}"
        facts.append(Fact("mask", value, COMPUTED, fill.op.where))
        named.extend(Named(trap, why, fill.op.where) for trap, why in finite_fill(fill))
        at = outgrown_at(fill)
        if at is not None:
            reading.outgrown_at = min(at, reading.outgrown_at or at)
        if fill.nan is not None:
            named.append(Named("mask_to_additive_nan", "the mask added to the scores holds "
                               "NaN (0 * -inf is NaN), and NaN spreads to every weight of its "
                               "rows", fill.nan.where))  # fmt: skip
    scores_scaled = [f for f in applied if f.where == "scores"]
    if scores_scaled and site.product is not None:  # q k^T made whole, then scaled
        named.append(Named("qk_overflow_half", "the scores are scaled after the product q k^T "
                           "is made: in float16 it can overflow first, where scaling the "
                           "queries first stays finite", scores_scaled[0].op.where))  # fmt: skip
    named.extend(_turned_apart(site, declared_pairing))
    if site.pairing is not None and site.rotated is not None:
        turn, table, made, turned = site.pairing
        said = f"the rotation turns {turn} together; its cos table repeats each angle for {table}"
        facts.append(Fact("rotary pairing", said, COMPUTED, made.where))
        at, also = made.where, (site.rotated.where,)
        if PAIRINGS.get(declared_pairing) == table:  # the table as declared: the turn is off
            at, also = turned.where, (made.where, site.rotated.where)
        named.append(Named("rope_pairing_mismatch", said, at, also, located=True))
    for cap in site.caps:
        facts.append(Fact("cap", "tanh on the scores", COMPUTED, cap.where))
        if any(fill.op.index < cap.index for fill in site.fills):
            named.append(Named("softcap_after_mask", "the scores are capped after the mask: "
                               "the tanh squashes its fill to minus the cap, which large "
                               "scores reach", cap.where))  # fmt: skip
    if site.rank_raised is not None:
        op, before, after = site.rank_raised
        shapes = f"{'x'.join(map(str, before))} to {'x'.join(map(str, after))}"
        facts.append(Fact("mask rank", f"the mask broadcasts the scores from {shapes}",
                          COMPUTED, op.where))  # fmt: skip
        built = next((f.origin for f in site.fills if f.op is op and f.origin), None)
        named.append(Named("mask_rank", f"the mask has more axes than the scores: applying it "
                           f"broadcasts them from {shapes}, every sequence against every "
                           "other", (built or op).where))  # fmt: skip
    for op, fact, axis, trap, why in (
        (site.merged_without_transpose, "heads merged", "queries'", "head_merge_no_transpose",
         "the heads are merged by a reshape that cuts up the queries' axis, so each output row "
         "mixes positions of several heads (or sequences): move the heads next to the width "
         "first (transpose(1, 2) on (B, h, T, d)), then reshape"),
        (site.split_without_transpose, "heads split", "positions'", "head_split_view",
         "the heads are split by a reshape that cuts up the positions' axis, so each head's rows "
         "mix positions with features: reshape to (B, T, h, d) first, then transpose(1, 2)"),
    ):  # fmt: skip
        if op is not None and trap == "head_split_view" and site.heads_for_positions:
            facts.append(Fact(fact, f"{op.name} to {'x'.join(map(str, op.shapes[0]))} puts a "
                              "piece of the projection's features (the heads) on the positions' "
                              "axis", COMPUTED, op.where))  # fmt: skip
            said = ("the heads are laid where the positions belong, so the attention runs "
                    "across heads, not tokens: split the features into (h, d) and move h "
                    "before the positions")  # fmt: skip
            named.append(Named(trap, said, op.where))
        elif op is not None:
            facts.append(Fact(fact, f"{op.name} to {'x'.join(map(str, op.shapes[0]))} cuts up "
                              f"the {axis} axis", COMPUTED, op.where))  # fmt: skip
            named.append(Named(trap, why, op.where))
    blocked = site.blocked(mixed=mixable)  # (T_q, T_k), the module's own masks' cells
    _window(site, reading, blocked, mixable)
    _future(site, reading, causal, made, blocked, mixable)
    if site.sdpa:  # where is_causal is decided, whatever this call's
        named.append(Named("cache_causal_alignment", "SDPA's is_causal=True anchors its "
                           "triangle at the top-left: with fewer queries than keys (a cached "
                           "call), pass it only when they are as many", site.softmax.where,
                           located=True, sole=True))  # fmt: skip
    reading.joins_own = not mixable and any(
        (f.origin or f.band) is not None and not f.own for f in site.fills
    )
    return reading


def _window(site: Site, reading: Reading, blocked: torch.Tensor | None, mixable: bool) -> None:
    """A window of past keys the module's masks keep (alone, or joined to the caller's mask):
    where its bound is, if a probe finds it a key off. A band the module cuts from positions
    its caller hands it (RecurrentGemma's segment positions) is its own bound too, though the
    mask's cells are not the module's alone."""
    if blocked is not None and blocked.shape[0] == blocked.shape[1]:
        T = blocked.shape[0]
        if blocked[torch.ones(T, T, dtype=torch.bool).tril(-1)].any():
            made = site.own_fills(mixable)
            kept = int((~blocked[T - 1, :T]).sum())
            said = f"the module's mask keeps the last {kept} keys up to each query"
            built = next((f.band for f in made if f.band), made[0].op)  # its own mask first
            reading.named.append(Named("sliding_window_off_by_one", said, built.where))
            return
    bands = [f.band for f in site.fills if f.band is not None and f.band.line]
    if bands:
        band = min(bands, key=lambda op: op.index)
        said = "the module cuts its mask to a band of recent keys here"
        reading.named.append(Named("sliding_window_off_by_one", said, band.where))


def _future(
    site: Site,
    reading: Reading,
    causal: bool,
    made: Callable[[str], str],
    blocked: torch.Tensor | None,
    mixable: bool,
) -> None:
    """Whether the module's own masks block the future (keys after their query), as a causal
    module's must: the first open key ahead of a query, when one is. A leak is named only for a
    module declared or found causal."""
    if site.sdpa and site.is_causal:
        reading.masks_future = reading.masks_future or site.softmax.where
    unmasked = site.sdpa_mask is None and not site.is_causal if site.sdpa else not site.fills
    if unmasked and causal:
        reading.facts.append(Fact("future", "no mask on the scores at all", COMPUTED))
        reading.named.append(Named("causal_leak", "no mask on the scores blocks keys after "
                                   "their query", site.softmax.where))  # fmt: skip
        return
    if blocked is None or blocked.shape[0] != blocked.shape[1] or not blocked.any():
        return  # no triangle of its own: the caller's mask is all there is
    T = blocked.shape[0]
    ahead = torch.ones(T, T, dtype=torch.bool).triu(1)
    behind = torch.ones(T, T, dtype=torch.bool).tril(-1)
    own = site.own_fills(mixable)
    line = next((f.origin.where for f in own if f.origin is not None), own[0].op.where)
    if blocked[ahead].any() and not blocked[behind].any():  # not a window of both sides
        reading.masks_future = reading.masks_future or line
    if blocked[ahead].all():
        said = "blocked (every key after its query)"
        made = own[0].cut or own[0].origin or own[0].op  # where the first of its own is made
        reading.named.append(Named("cache_causal_alignment", "the causal triangle is made here: "
                                   "with fewer queries than keys (a cached call) its rows are "
                                   "the last ones, anchored bottom-right", made.where,
                                   located=True, sole=True))  # fmt: skip
        if blocked.diagonal().any():
            said += "; some queries' own key is blocked too"
            if causal and blocked.all(-1).any():  # a triangle a diagonal off: rows left empty
                reading.named.append(Named("causal_leak", "the module's causal mask blocks "
                                           "each query's own key too (a diagonal off), so the "
                                           "first query is left no key at all", line))  # fmt: skip
        reading.facts.append(Fact("future", said, COMPUTED, line))
        return
    held = next((f.held for f in own if f.held is not None and f.held.ref), None)
    built = made(str(held.ref)) if held is not None else ""
    words = f"; self.{str(held.ref).rsplit('.', 1)[-1]} is made at {built}" if built else ""
    also = (built,) if built else ()
    if not blocked[ahead].any():
        if causal and not site.sdpa and blocked[~ahead].all():  # an SDPA mask: sdpa_mask's
            reading.facts.append(Fact("future", "open: every key after its query; every key "
                                      "up to it is blocked", COMPUTED, line))  # fmt: skip
            reading.named.append(
                Named(
                    "mask_bool",
                    "the module's causal mask blocks each "
                    "query's own and earlier keys and keeps the later ones: "
                    f"it is read the wrong way round{words}",
                    line,
                    also,
                )
            )
        return  # not a causal triangle (a padding mask of its own, a window of past keys)
    open_ahead = (ahead & ~blocked).nonzero()
    gap = int((open_ahead[:, 1] - open_ahead[:, 0]).min())
    reading.facts.append(Fact("future", f"open: key t + {gap} is not blocked for query t",
                              COMPUTED, line))  # fmt: skip
    if causal:
        reading.named.append(Named("causal_leak", f"the module's causal mask leaves key t + "
                                   f"{gap} open to query t{words}", line, also))  # fmt: skip


def interpret(
    found: Record,
    d_model: int,
    keep: torch.Tensor | None = None,
    declared_scale: float | None = None,
    made: Callable[[str], str] = lambda name: "",
    causal: bool = False,
    declared_pairing: str = "auto",
) -> Reading:
    """One recorded call (``record``), read: facts and named traps, for a module held to be
    ``causal`` or not (read again, not recorded again, once the doctor knows which). ``keep``
    is the keep-mask the call was given (True: attend), to read a fill's direction against;
    ``declared_pairing``, the rotary pairing the user declared."""
    reading = Reading()
    raised = [op for op in found.ops if op.raised]
    if raised:
        reading.raised = raised[-1]
        reading.facts.append(Fact("raises", raised[-1].raised, COMPUTED, raised[-1].where))
        if heads_before_positions(raised[-1]):
            reading.named.append(Named("head_split_view", "the heads are split by a view to "
                                       "(B, h, T, d) of a (B, T, h d) projection, the heads "
                                       "before the positions: view to (B, T, h, d), then "
                                       "transpose(1, 2)", raised[-1].where))  # fmt: skip
        swapped = keys_transposed(found, raised[-1])
        if swapped is not None:
            op, (a, b) = swapped
            reading.named.append(Named("transpose", f"the keys are transposed on axes ({a}, "
                                       f"{b}) before their product with the queries, which "
                                       "needs their last two swapped", op.where))  # fmt: skip
    for site in sites(found):
        mixable = keep is not None and bool(keep[0].all())
        one = site_facts(site, d_model, declared_scale, made, causal, mixable, declared_pairing)
        for fill in site.fills if keep is not None else ():
            turned = turned_given(found, fill) if not fill.own and fill.mask else None
            if turned is not None:  # in a causal module, both the future and the padding
                said = (
                    "the mask the module is given, laid (queries, keys), is transposed "
                    "before it is applied: each query reads another's row of it"
                )
                traps = ("causal_leak", "padding_on_queries") if causal else ("padding_on_queries",)
                one.named += [Named(trap, said, turned.where) for trap in traps]
        for misread in (
            fills_kept_cells(site, keep, causal, found),
            sdpa_mask(site, keep, causal, found),
        ):
            if misread is not None:
                one.named.append(misread)
        unread = unread_mask(site) if keep is not None else []
        one.facts += unread
        if unread:
            reading.mask_unread = reading.mask_unread or unread[0].line
        reading.facts += [f for f in one.facts if f not in reading.facts]  # a head per site
        reading.named += [n for n in one.named if n not in reading.named]
        reading.masks_future = reading.masks_future or one.masks_future
        if site.rotated is not None:
            reading.rotary = reading.rotary or site.rotated.where
        reading.head_width = reading.head_width or site.width or None
        if reading.weights is None and not site.sdpa and site.key_axis is not None:
            reading.weights = (
                found.results[site.softmax.index][0].detach().movedim(site.key_axis, -1)
            )
        reading.joins_own = reading.joins_own or one.joins_own
        if site.gate is not None and not reading.gated:
            reading.gated = site.gate.where
            reading.facts.append(Fact("output", "multiplied by a gate made from the input before "
                                      "its projection: not attention's alone", COMPUTED,
                                      site.gate.where))  # fmt: skip
        shared = shared_heads(site.values)
        if shared is not None and reading.shared_values is None:
            reading.shared_values, reading.shared_keys = shared, shared_heads(site.keys)
            said = "; ".join(f"heads {', '.join(map(str, sorted(s)))}" for s in shared)
            said = f"one copy of the values each for {said} ({grouping(shared)})"
            reading.facts.append(Fact("K/V heads", said, COMPUTED, site.softmax.where))
        if one.outgrown_at is not None:
            reading.outgrown_at = min(one.outgrown_at, reading.outgrown_at or one.outgrown_at)
        read = site.projections
        if not reading.projections and all(read.get(r) for r in ("queries", "keys", "values")):
            reading.projections = dict(read)
            roles = ("queries", "keys", "values", "output")
            said = ", ".join(f"{role} by `{read[role]}`" for role in roles if read.get(role))
            reading.facts.append(Fact("projections", said, COMPUTED))
        reading.attention_found = True
    fused = next((op for op in found.ops if op.name in FUSED), None)
    if not reading.attention_found and fused is not None:
        said = f"inside one torch call ({fused.name}), whose steps are not recorded"
        reading.facts.append(Fact("attention", said, COMPUTED, fused.where))
        masks = [v for v in fused.tensors if v.kind != "parameter" and zero_one(found.result(v))]
        if masks:  # said where the mask was made a float, where the record saw it made
            made = found.producer(masks[0])
            line = made.where if made is not None and made.line else fused.called_where
            reading.named.append(Named("sdpa_float_mask", "a float 0/1 mask is given to "
                                       f"{fused.name}, which adds a float mask to the scores: "
                                       "it blocks nothing", line))  # fmt: skip
    elif not reading.attention_found and not raised:
        reading.facts.append(Fact("attention", "no softmax of a product, nor an SDPA call, in "
                                  "the recorded forward", COMPUTED))  # fmt: skip
    angles = angles_made(found) if reading.rotary else None
    if angles is not None:  # where a probe finds far positions' angles imprecise, look here
        reading.angles_half = bool(angles.dtypes) and angles.dtypes[0].itemsize < 4
        reading.named.append(Named("rope_low_precision", "rotary's angles are made here, "
                                   "positions times inverse frequencies", angles.where,
                                   located=True))  # fmt: skip
    naive = naive_softmax(found)
    if naive is not None:  # where a probe finds NaN at large scores, this is why
        reading.named.append(Named("naive_exp_softmax", "the softmax is written out as exp / "
                                   "sum of exp with no row maximum subtracted first",
                                   naive.where, located=True))  # fmt: skip
    tiled = tilings(found)
    if tiled:
        also = tuple(dict.fromkeys(op.where for op in tiled[1:] if op.where != tiled[0].where))
        reading.named.append(Named("gqa_kv_grouping", "K/V heads are tiled (repeat), so query "
                                   "head i reads K/V head i % kv_heads, not i // n_rep",
                                   tiled[0].where, also))  # fmt: skip
    left_on = dropout_left_on(found)
    if left_on is not None:
        how, op = left_on
        reading.facts.append(Fact("dropout", f"on in eval mode: {how}", COMPUTED, op.where))
        reading.named.append(Named("dropout_in_eval", f"a dropout drops in eval mode ({how}): "
                                   "turn it on only while training", op.where))  # fmt: skip
    if found.truncated:
        reading.facts.append(Fact("record", "cut short: the forward ran more ops than are kept"))
    return reading
