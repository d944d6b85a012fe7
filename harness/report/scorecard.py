"""report.md's first table: every claim of the tutorial, one row each, judged by a measurement
(a pair's, from ``results``, or one of ``harness.tutorial``'s): the claim in a line, whether it
holds, the number that decides it, what to write instead, and where it is measured."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from harness.catalogue.verdicts import Verdict
from harness.files import CLAIMS_PAGE
from harness.report.format import TRAINED, anchor, link, num, over_seeds, prose, table
from harness.report.results import TrapResult
from harness.tutorial import claims, specialise
from harness.tutorial.own_code import example

SCORECARD = "## The tutorial, claim by claim"
TUTORIAL_CODE = "tutorial-code"  # the anchor of the section on the tutorial's own modules
CLAIMS_HERE = "claims-measured-here"  # the anchor of the claims no pair measures
TRUE, FALSE, PARTLY, UNMEASURED = "true", "**false**", "partly", "not measured in this run"
HOLDS, MEASURED_IN = "holds?", "measured in"  # two columns: the page shows the first, linked

SEEDS = f"seeds 0–{len(claims.SEEDS) - 1}"
RECIPROCAL = "max ulp (× 1/float vs ÷ tensor)"  # scale_precision's sweep of the tutorial's form

Results = dict[str, TrapResult]
Judged = tuple[str, str]  # (holds, the number that decides it)


def _is_trap(r: TrapResult) -> bool:
    """The buggy form is wrong somewhere: not BENIGN."""
    return r.overall(r.primary.device) is not Verdict.BENIGN


def _verdict(r: TrapResult) -> str:
    return str(r.overall(r.primary.device))


def _as_measured(r: TrapResult, holds: str) -> Judged:
    """``holds``, with the pair's verdict and its reason as the number: where the measurement
    goes the other way than the catalogue's finding, it says what it found."""
    return holds, f"{_verdict(r)}: {r.primary.reason}"


def _spread(_: Results) -> Judged:
    spreads = claims.dot_product_spread()
    first, last = spreads[0], spreads[-1]
    scaled = [s.scaled for s in spreads]
    grows = last.unscaled / first.unscaled > 0.5 * (last.d_k / first.d_k) ** 0.5
    held = all(0.8 < s < 1.25 for s in scaled)
    low, high = num(min(scaled)), num(max(scaled))
    divided = f"{low} at every d_k" if low == high else f"{low}–{high}"
    return (TRUE if grows and held else FALSE), (
        f"spread of q · k: {num(first.unscaled)} at d_k {first.d_k}, {num(last.unscaled)} at "
        f"{last.d_k}; scaled: {divided}"
    )


def _discrimination(_: Results) -> Judged:
    counts = claims.discrimination()
    first, last = counts[0], counts[-1]
    loses = first.favourites < first.keys and last.favourites == last.keys
    favoured = ", ".join(f"{c.favourites} at d_k {c.d_k}" for c in counts[:-1])  # "2 at d_k 1"
    return (TRUE if loses else FALSE), (
        f"of {first.keys} keys, those a query can weigh most: {favoured}, all at {last.d_k}"
    )


def _scale_gradients(_: Results) -> Judged:
    g = claims.scale_gradients()
    return (FALSE if g.ratio_min > 1 else TRUE), (
        f"without it W_q's gradient is {num(g.ratio_min)}–{num(g.ratio_max)}x larger at d_k "
        f"{g.d_k}, not smaller ({SEEDS})"
    )


def _trained(r: TrapResult) -> str:
    """ "; training: <the tally>" where the trap was trained, else ""."""
    return f"; {TRAINED}{r.learning.diagnosis.label}" if r.learning else ""


def _bias(r: TrapResult) -> Judged:
    if _is_trap(r):
        return _as_measured(r, TRUE)
    return PARTLY, (
        f"a key bias changes no output{_trained(r)}; large-scale pretraining not measured"
    )


def _bmm_safer(_: Results) -> Judged:
    b = claims.mask_broadcast()
    return (TRUE if b.bmm_error and len(b.matmul_output) == 4 else FALSE), (
        f"a (B, 1, T, T) mask, B = 2: bmm raises; `@` returns {b.matmul_output}, an extra axis"
    )


def _raises_mostly(r: TrapResult, holds: str, harm: str) -> Judged:
    """A CONDITIONAL claim: it raises on most shapes and runs silently, doing ``harm``, on the
    trigger shape the search finds."""
    m = r.primary
    if not _is_trap(r):
        return _as_measured(r, FALSE)
    where = f"silent on {m.trigger.label()}, " if m.trigger else ""
    return holds, f"{_verdict(r)}: {where}{harm}"


def _transpose(r: TrapResult) -> Judged:
    return _raises_mostly(r, TRUE, "mixing batch elements")


def _missing_transpose(_: Results) -> Judged:
    t = claims.missing_transpose()
    return (PARTLY if t.error and t.silent_error > 0 else TRUE), (
        f"`bmm(Q, K)` raises when d_k ≠ T, but runs when d_k = T, off by {num(t.silent_error)} "
        "(unit-variance Q, K)"
    )


def _fill_zero(r: TrapResult) -> Judged:
    ex = example()
    partly = _is_trap(r)
    return (PARTLY if partly and ex.lower_triangular else TRUE if ex.lower_triangular else FALSE), (
        f"weight 0 where masked, but a query with no allowed key gives NaN ({_verdict(r)})"
    )


def _softmax_dim(r: TrapResult) -> Judged:
    if not _is_trap(r):
        return _as_measured(r, TRUE)
    s = claims.implicit_softmax()
    nan_rows = f"{s.nan_rows_min}" if s.nan_rows_min == s.nan_rows_max else (
        f"{s.nan_rows_min}–{s.nan_rows_max}")  # fmt: skip
    each = " on every seed" if s.nan_rows_min == s.nan_rows_max else ""
    return FALSE, (
        f"it normalises over dim 0, the batch: row sums are off by "
        f"{num(s.row_sum_min)}–{num(s.row_sum_max)}; under the causal mask {nan_rows} of "
        f"{s.rows} rows are NaN{each} ({SEEDS})"
    )


def _example(_: Results) -> Judged:
    ex = example()
    if ex.as_written == "runs":
        return TRUE, f"runs: output and weights {ex.shapes[0]}, {ex.shapes[1]}"
    triangular = ", lower-triangular" if ex.lower_triangular else ", not lower-triangular"
    return FALSE, f"as written it raises; with a (1, 3, 3) mask it runs{triangular}"


def _mask_broadcast(_: Results) -> Judged:
    b = claims.mask_broadcast()
    return (TRUE if len(b.masked) == 3 else FALSE), (
        f"masked_fill with it gives {b.masked} for B = 2, not (2, 3, 3)"
    )


def _reciprocal_sweep(r: TrapResult) -> str:
    """The bound the card's sweep keeps between the tutorial's ``* (1 / math.sqrt(d_k))`` and
    the tensor's division ("" when the card gives none)."""
    for extra in r.extras:
        if RECIPROCAL in extra.columns:
            return str(extra[RECIPROCAL].iloc[-1])
    return ""


def _precision(r: TrapResult) -> Judged:
    """§4.1: BENIGN, the tutorial's own form within ulps, and training alike."""
    if _is_trap(r):
        return _as_measured(r, TRUE)
    bound = _reciprocal_sweep(r)
    own = f"; the tutorial's `* (1 / math.sqrt(d_k))`: {bound} ulp off (d_k 1–1024)"
    own = own if bound else ""
    return FALSE, f"BENIGN{own}{_trained(r)}"


def _reciprocal(_: Results) -> Judged:
    printed = claims.tensor_reciprocal()
    return (TRUE if printed == "0.12500000000000001" else FALSE), (
        f"it is {printed}, exactly what `1 / math.sqrt(64)` gives"
    )


def _output_error(r: TrapResult) -> str:
    """buggy.py's output error over the seeds where it moves with them, else seed 0's."""
    if r.spread and r.spread.low:
        return f"{over_seeds(r.spread)} over {SEEDS}"
    return f"{num(r.primary.summary()['err_bug'])} on seed 0"


def _mask_bool(r: TrapResult) -> Judged:
    if not _is_trap(r):
        return _as_measured(r, FALSE)
    return TRUE, (
        f"{_verdict(r)}: each query sees only what it must not; output error {_output_error(r)}"
    )


def _float_throughout(r: TrapResult) -> Judged:
    """§4.2's float masks everywhere: masked_fill refuses one, SDPA adds one."""
    if not _is_trap(r):
        return _as_measured(r, TRUE)
    return PARTLY, (
        "SDPA adds a float mask: a 0/1 "
        f"keep-mask leaks ({_verdict(r)}; output error {_output_error(r)})"
    )


def _converts(_: Results) -> Judged:
    f = claims.float_masks()
    raised = [e for e in (f.float_in_masked_fill, f.large_fill_in_half) if e]
    return (FALSE if raised else TRUE), (
        "nothing converts: `masked_fill` raises on a float mask, and -1e9 raises in float16"
    )


def _batch_contract(_: Results) -> Judged:
    c = claims.batch_contract()
    return (TRUE if c.bmm_error else FALSE), (
        f"batch 2 against batch 3: bmm raises; against batch 1, `@` broadcasts to {c.matmul_shape}"
    )


def _v_layout(r: TrapResult) -> Judged:
    return _raises_mostly(r, PARTLY, "mixing features with positions")


def _bmm_always(_: Results) -> Judged:
    apart = claims.bmm_matches_matmul()
    return (PARTLY if apart == 0 else TRUE), (
        f"on 3-D tensors they agree to the bit (largest difference {num(apart)}); only `@` "
        "broadcasts"
    )


def _init(r: TrapResult) -> Judged:
    s = r.primary.summary()
    if _is_trap(r):
        return _as_measured(r, TRUE)
    return FALSE, (
        f"BENIGN over {r.primary.seeds} seeds: mean entropy {num(s['entropy_bug'])} with the "
        f"default, {num(s['entropy_fix'])} with xavier, both healthy"
    )


def _xavier(_: Results) -> Judged:
    x = claims.xavier_variance()
    said_right = abs(x.measured - x.said) < abs(x.measured - x.formula)
    return (TRUE if said_right else FALSE), (
        f"{num(x.measured)} measured ({x.fan_in} → {x.fan_out}): 2/(fan_in + fan_out) = "
        f"{num(x.formula)}, 1/fan_in = {num(x.said)}"
    )


def _head_parameters(_: Results) -> Judged:
    split, single = claims.head_parameters()
    return (TRUE if split == single else FALSE), (
        f"{split:,} weights with 8 heads of width 64, {single:,} with one of 512"
    )


def _specialise(_: Results) -> Judged:
    roles = specialise.head_roles()
    holds = {specialise.SPLIT: TRUE, specialise.SHARED: FALSE}.get(roles.tally.claim, PARTLY)
    took = (f"≥ {num(roles.share_min)} of each head's weight on one" if holds == TRUE
            else "the heads do not reliably split them")  # fmt: skip
    task = " and ".join(map(str, specialise.LOOKBACK))
    return holds, f"trained to name the tokens {task} back, {took}; {TRAINED}{roles.tally.text()}"


def _head_loop(r: TrapResult) -> Judged:
    if _is_trap(r):
        return _as_measured(r, FALSE)
    return PARTLY, ("BENIGN: the numbers of one fused projection, only slower (timings.md)")


def _parallel(_: Results) -> Judged:
    loop = claims.head_loop()
    serial = loop.loop_products > loop.products_per_head
    rest = loop.loop_products - loop.heads * loop.products_per_head  # W_o's
    return (FALSE if serial else TRUE), (
        f"its {loop.heads} heads run in turn: {loop.loop_products} matrix products a call, "
        f"{loop.products_per_head} per head, {rest} to mix them"
    )


def _unnormalised(_: Results) -> Judged:
    u = claims.unnormalised_exp()
    return (TRUE if u.error_max < 0.1 else FALSE), (
        f"rows sum to {num(u.row_sum_min)}–{num(u.row_sum_max)}, not 1; output off by "
        f"{num(u.error_min)}–{num(u.error_max)}x its own scale ({SEEDS})"
    )


@dataclass(frozen=True)
class Claim:
    """One row: where the tutorial says it, what it says (its hedges kept), what to write, and
    how it is judged: by the pair ``trap`` (its result is handed to ``judge``) or, where
    ``trap`` is "", by a measurement of its own (``judge`` gets every result)."""

    section: str
    says: str
    instead: str
    judge: Callable
    trap: str = ""
    where: str = ""  # the anchor that shows it, when no pair does
    leads_to: str = ""  # the trap the advice leads to, linked after it


CLAIMS = [
    Claim("§2", "a large d_k makes dot products explode, so divide by sqrt(d_k)",
          "`scores / math.sqrt(d_k)`", _spread, where=CLAIMS_HERE, leads_to="missing_scale"),
    Claim("§2", "a d_k too small loses discrimination",
          "d_k 64, as in the paper", _discrimination, where=CLAIMS_HERE),
    Claim("§3.1", "the scale keeps the gradients from vanishing",
          "keep it: it tames large gradients", _scale_gradients, where=CLAIMS_HERE),
    Claim("§3.2", "`bias=False` is the paper's; a bias may break symmetry and stability "
          "(early stopping sooner) in large-scale pretraining",
          "either; a key bias is dead weight", _bias, trap="qkv_bias"),
    Claim("§3.2", "`bmm` is safer than `@`, which broadcasts silently",
          "assert the shapes", _bmm_safer, trap="mask_rank"),
    Claim("§3.2", "`K.transpose(0, 1)` gives a bmm error or a garbled result",
          "`K.transpose(1, 2)`", _transpose, trap="transpose"),
    Claim("§3.2", "leaving out K's transpose gives a bmm error",
          "`K.transpose(1, 2)`, and test with d_k ≠ T", _missing_transpose,
          where=CLAIMS_HERE),
    Claim("§3.2", "`masked_fill(mask == 0, -inf)` then softmax puts weight 0 there",
          "zero the rows with no allowed key", _fill_zero,
          trap="fully_masked_row"),
    Claim("§3.2", "without `dim=-1` softmax normalises over all elements",
          "`F.softmax(scores, dim=-1)`", _softmax_dim, trap="softmax_dim"),
    Claim("§3.2", "a (B, 1, T, T) mask broadcasts to (B, T, T)",
          "a (B, T, T) mask", _mask_broadcast, trap="mask_rank"),
    Claim("§3.3", "the example's output and weights are (1, 3, 3), lower-triangular",
          "a (1, 3, 3) mask", _example, where=TUTORIAL_CODE),
    Claim("§4.1", "`1 / math.sqrt(d_k)` loses precision, and the loss jitters over thousands "
          "of steps: use a float32 tensor",
          "`scores / math.sqrt(d_k)`", _precision, trap="scale_precision"),
    Claim("§4.1", "`1 / torch.sqrt(torch.tensor(64.))` is 0.12500000000000001",
          "either: both give 0.125", _reciprocal, where=CLAIMS_HERE),
    Claim("§4.2", "`masked_fill(mask.bool(), -1e9)` on a keep-mask fills the wrong positions",
          "`masked_fill(mask == 0, float('-inf'))`", _mask_bool, trap="mask_bool"),
    Claim("§4.2", "use float masks throughout",
          "a bool mask, True = attend, for SDPA", _float_throughout,
          trap="sdpa_float_mask"),
    Claim("§4.2", "PyTorch converts between a -1e9 fill and a bool mask implicitly",
          "`torch.finfo(dtype).min` as the fill", _converts,
          where=CLAIMS_HERE, leads_to="fill_overflow_half"),
    Claim("§4.3", "bmm needs the batch sizes to match (cross-attention)",
          "check both batch sizes", _batch_contract,
          where=CLAIMS_HERE),
    Claim("§4.4", "V laid out as (B, d_v, T) breaks `weights @ V`, and `bmm` catches it",
          "V as (B, T, d_v), and test with d_v ≠ T", _v_layout, trap="v_layout"),
    Claim("§4.4", "always use `bmm`, never `@`",
          "either on 3-D tensors; assert the shapes", _bmm_always, where=CLAIMS_HERE),
    Claim("§4.5", "nn.Linear's default init makes Q K^T too large or too small: use xavier",
          "the default; avoid `normal_(std=1)`", _init, trap="init_variance",
          leads_to="init_unit_variance"),
    Claim("§4.5", "xavier's variance is 1/fan_in",
          "2/(fan_in + fan_out)", _xavier, where=CLAIMS_HERE),
    Claim("§5.1", "heads of width d_model / h keep the parameter count",
          "split with `view(B, T, h, d_k).transpose(1, 2)`", _head_parameters, where=CLAIMS_HERE,
          leads_to="head_split_view"),
    Claim("§5.1", "heads specialise",
          "as many heads as look-ups", _specialise, where=CLAIMS_HERE),
    Claim("§5.2", "multi-head attention as a `ModuleList` of single heads",
          "heads as an axis of one projection", _head_loop, trap="head_loop"),
    Claim("§5.2", "the heads are computed in parallel",
          "heads as an axis of one product", _parallel, where=CLAIMS_HERE),
    Claim("§6.3", "`exp(Q K^T)` without softmax's normalisation: faster, nearly lossless",
          "softmax, or divide by the row sums", _unnormalised, where=CLAIMS_HERE),
]  # fmt: skip


def judged(claim: Claim, results: Results) -> Judged:
    """(holds, number) for one claim; UNMEASURED when its pair is not among ``results``."""
    if not claim.trap:
        return claim.judge(results)
    if claim.trap not in results:
        return UNMEASURED, ""
    return claim.judge(results[claim.trap])


def scorecard_table(results: list[TrapResult], to: Callable[[str], str] = link) -> pd.DataFrame:
    """One row a claim, its trap linked with ``to`` (by default on the same page)."""
    by_id = {r.pair.card.id: r for r in results}
    rows = []
    for claim in CLAIMS:
        holds, number = judged(claim, by_id)
        where = CLAIMS_PAGE if claim.where == CLAIMS_HERE else ""
        shown = to(claim.trap) if claim.trap else f"[here]({where}#{claim.where})"
        instead = claim.instead + (f" (see {to(claim.leads_to)})" if claim.leads_to else "")
        rows.append({"§": claim.section, "the tutorial says": claim.says, HOLDS: holds,
                     "the number that decides it": number, "write instead": instead,
                     MEASURED_IN: shown})  # fmt: skip
    return pd.DataFrame(rows)


BOOL_OR_FLOAT = (
    "**Bool or float mask?** Either, with `masked_fill(mask == 0, ...)`: what matters is which "
    "value means attend (`mask.bool()` on a keep-mask turns it round) and the fill (`-inf` or "
    "the dtype's smallest value; -1e9 overflows float16). The dtype matters only for SDPA, which "
    "adds a float mask to the scores: a 0/1 keep-mask there leaks the future."
)


def scorecard(results: list[TrapResult], to: Callable[[str], str] = link) -> str:
    """The scorecard section: the table (traps linked with ``to``), then the answer to bool
    against float."""
    card = scorecard_table(results, to)
    counts = card[HOLDS].value_counts()
    tally = (f"Of its {len(card)} claims, {counts.get(TRUE, 0)} hold, {counts.get(PARTLY, 0)} "
             f"hold in part and {counts.get(FALSE, 0)} are false.")  # fmt: skip
    shown = card.assign(
        **{
            HOLDS: [
                f"[{holds}]({where.split('](')[1]}"
                for holds, where in zip(card[HOLDS], card[MEASURED_IN], strict=True)
            ]
        }
    )
    shown = shown.drop(columns=MEASURED_IN)  # the verdict links to where it is measured
    return "\n".join([SCORECARD, "", tally, "", table(shown), "", prose(BOOL_OR_FLOAT)])


def claims_measured_here() -> str:
    """How the scorecard's rows that no pair measures were measured: on the tutorial's page."""
    sp = specialise
    text = (
        "The scorecard's rows that no pair measures, each by a function of "
        "`harness/tutorial/claims.py`, on the CPU in float32 from seeded generators: §2, the "
        "standard deviation of q · k over 4,096 pairs of unit-variance vectors per d_k (seed "
        "0), and, for discrimination, how many of 64 unit-variance keys (seed 0) are the "
        "top-scoring key of at least one of 100,000 random queries (seed 1), in float64: with "
        "d_k 1 a score is a key times a number, so only the largest or the smallest key can "
        "win; §3.1, the norm of W_q's gradient in the tutorial's `ScaledDotProductAttention(256, "
        "256, 256)` (its default init, unit-variance x of 4 x 32 tokens, a random upstream "
        "gradient) with its scale and with the scale set to 1, over seeds 0–9; §3.2, `bmm(Q, "
        "K)` on (2, 4, 8) tensors and on (2, 4, 4) ones; §4.1, `1 / torch.sqrt(torch.tensor("
        "64.0))` printed; §4.2, `masked_fill` given a 0/1 float mask, and a -1e9 fill on "
        "float16 scores; §4.3, `bmm` and `@` on queries and keys whose batch sizes differ; "
        "§4.4, `bmm` against `@` on the same (4, 16, 64) tensors; §4.5, the variance of "
        "`xavier_uniform_` on a 64 x 512 weight (seed 0); §5.1, the weights of W_q, W_k, W_v "
        "and W_o counted both ways, and, for specialisation, by "
        f"`harness/tutorial/specialise.py`: the tutorial's `MultiHeadAttention({sp.D_MODEL}, "
        f"{sp.HEADS})` between token and position embeddings and a read-out, no residual path, "
        f"trained (Adam, {sp.STEPS} steps of {sp.BATCH} random rows of {sp.SEQ_LEN} tokens, "
        f"a vocabulary of {sp.VOCAB}, causal keep-mask) to name at each place the tokens "
        f"{' and '.join(map(str, sp.LOOKBACK))} back, on seeds {sp.SEEDS[0]}–{sp.SEEDS[-1]}, "
        f'then read on a held-out batch: a seed counts as "{sp.SPLIT}" when each head puts '
        "most of its weight (over half) on a different one of the places; §5.2, the matrix "
        "products one call of the tutorial's "
        "`MultiHeadAttention(512, 8)` runs, counted as it runs; §6.3, `exp(Q K^T / sqrt(d_k)) "
        "@ V` against softmax's for unit-variance q, k, v (128 tokens, d_k 64), its largest "
        "error over the largest |value| of softmax's output, over seeds 0–9. Wall-clock speed "
        'varies from run to run, so §6.3\'s "3x faster" is not judged here: the loss it pays '
        "is."
    )
    heading = "## How the claims no pair measures were measured"
    return f"{anchor(CLAIMS_HERE)}\n{heading}\n\n{prose(text)}"
