"""report.md's first table: every claim of the tutorial, one row each, judged by a measurement
(a pair's, from ``results``, or one of ``harness.tutorial``'s): the claim in a line, whether it
holds, the number that decides it, what to write instead, and where it is measured."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from harness.catalogue.verdicts import MEANING, Verdict
from harness.report.format import anchor, link, num, prose, table
from harness.report.results import TrapResult
from harness.tutorial import claims
from harness.tutorial.own_code import example

SCORECARD = "## The tutorial, claim by claim"
TUTORIAL_CODE = "tutorial-code"  # the anchor of the section on the tutorial's own modules
CLAIMS_HERE = "claims-measured-here"  # the anchor of the claims no pair measures
TRUE, FALSE, PARTLY, UNMEASURED = "true", "**false**", "partly", "not measured in this run"

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
        f"spread of q · k for unit-variance q, k: {num(first.unscaled)} at d_k {first.d_k}, "
        f"{num(last.unscaled)} at {last.d_k}; divided by sqrt(d_k): {divided} (seed 0, 4,096 "
        "pairs)"
    )


def _bias(r: TrapResult) -> Judged:
    if _is_trap(r):
        return _as_measured(r, TRUE)
    return FALSE, (
        "with a key bias the output and every gradient stay within float32 rounding of the "
        "bias-free module's: softmax ignores a per-query constant"
    )


def _bmm_safer(_: Results) -> Judged:
    b = claims.mask_broadcast()
    return (TRUE if b.bmm_error and len(b.matmul_output) == 4 else FALSE), (
        f"a (B, 1, T, T) mask on (B, T, T) scores, B = 2: bmm raises ({b.bmm_error}); `@` "
        f"returns {b.matmul_output}, an extra axis"
    )


def _raises_mostly(r: TrapResult, trigger_note: str, harm: str) -> Judged:
    """A CONDITIONAL claim: it raises on most shapes and runs silently, doing ``harm``, on the
    trigger shape the search finds."""
    m = r.primary
    if not _is_trap(r):
        return _as_measured(r, FALSE)
    where = f", runs silently on {m.trigger.label()}{trigger_note}" if m.trigger else ""
    return TRUE, f"{_verdict(r)}: raises on most shapes{where}, {harm}"


def _transpose(r: TrapResult) -> Judged:
    return _raises_mostly(r, "", "mixing batch elements")


def _fill_zero(r: TrapResult) -> Judged:
    ex = example()
    partly = _is_trap(r)
    return (PARTLY if partly and ex.lower_triangular else TRUE if ex.lower_triangular else FALSE), (
        "weight 0 where masked (the example's rows: lower-triangular), but a query with no "
        f"allowed key gives NaN ({_verdict(r)}: {r.primary.reason})"
    )


def _softmax_dim(r: TrapResult) -> Judged:
    att = r.primary.attention.set_index("run")
    nan_rows, off = att.loc["bug", "nan_rows"], att.loc["bug", "row_sum_err"]
    if not _is_trap(r):
        return _as_measured(r, TRUE)
    return FALSE, (
        f"it normalises over dim 0, the batch: rows miss summing to 1 by up to {num(off)}, and "
        f"under the causal mask {int(nan_rows)} rows are NaN"
    )


def _example(_: Results) -> Judged:
    ex = example()
    if ex.as_written == "runs":
        return TRUE, f"runs: output and weights {ex.shapes[0]}, {ex.shapes[1]}"
    return FALSE, (
        f"as written it raises ({ex.as_written}); with a (1, 3, 3) mask: output "
        f"{ex.shapes[0]}, weights {ex.shapes[1]}, lower-triangular: {ex.lower_triangular}"
    )


def _mask_broadcast(_: Results) -> Judged:
    b = claims.mask_broadcast()
    return (TRUE if len(b.masked) == 3 else FALSE), (
        f"masked_fill with it gives {b.masked} for B = 2, not (2, 3, 3); bmm then raises"
    )


def _mask_bool(r: TrapResult) -> Judged:
    s = r.primary.summary()
    if not _is_trap(r):
        return _as_measured(r, FALSE)
    return TRUE, (
        f"{_verdict(r)}: output error {num(s['err_bug'])}, where fixed.py's is within float32 "
        "rounding: each query attends only to the keys it must not see"
    )


def _benign_claim(r: TrapResult) -> Judged:
    """A trap the tutorial names that measures as BENIGN: the claim is false."""
    if _is_trap(r):
        return _as_measured(r, TRUE)
    cells = ", ".join(m.dtype for m in r.cells)
    return FALSE, f"BENIGN: output and every gradient within rounding noise ({cells})"


def _batch_contract(_: Results) -> Judged:
    c = claims.batch_contract()
    return (TRUE if c.bmm_error else FALSE), (
        f"queries of batch 2 against keys of batch 3: bmm raises; against batch 1, `@` "
        f"broadcasts silently to {c.matmul_shape}"
    )


def _v_layout(r: TrapResult) -> Judged:
    return _raises_mostly(r, " (d_v == T)", "mixing features with positions")


def _init(r: TrapResult) -> Judged:
    s = r.primary.summary()
    if _is_trap(r):
        return _as_measured(r, TRUE)
    return FALSE, (
        f"BENIGN: {r.primary.reason}; mean entropy {num(s['entropy_bug'])} with the default, "
        f"{num(s['entropy_fix'])} with xavier (the sharper)"
    )


def _head_parameters(_: Results) -> Judged:
    split, single = claims.head_parameters()
    return (TRUE if split == single else FALSE), (
        f"{split:,} projection weights with 8 heads of width 64, {single:,} with one head of "
        "width 512 (d_model 512)"
    )


def _head_loop(r: TrapResult) -> Judged:
    if _is_trap(r):
        return _as_measured(r, FALSE)
    return PARTLY, (
        "BENIGN: within rounding noise of one fused projection; h small matmuls instead of "
        "one (slower: the ratio is in timings.md, which each run writes beside this page)"
    )


def _unnormalised(_: Results) -> Judged:
    u = claims.unnormalised_exp()
    return (TRUE if u.error_max < 0.1 else FALSE), (
        f"rows of exp(Q K^T / sqrt(d_k)) sum to {num(u.row_sum_min)}–{num(u.row_sum_max)}, "
        f"not 1; the output is off by {num(u.error_min)}–{num(u.error_max)}x its own scale "
        f"(T 128, d_k 64, seeds 0–{len(claims.SEEDS) - 1})"
    )


@dataclass(frozen=True)
class Claim:
    """One row: where the tutorial says it, what it says, what to write, and how it is judged:
    by the pair ``trap`` (its result is handed to ``judge``) or, where ``trap`` is "", by a
    measurement of its own (``judge`` gets every result)."""

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
    Claim("§3.2", "`bias=False` is required: a bias breaks attention's symmetry and stability",
          "either; a key bias is dead weight", _bias, trap="qkv_bias"),
    Claim("§3.2", "`bmm` is safer than `@`, which broadcasts silently",
          "bmm on 3-D tensors, or assert the shapes", _bmm_safer, trap="mask_rank"),
    Claim("§3.2", "`K.transpose(0, 1)` gives a bmm error or a garbled result",
          "`K.transpose(-2, -1)`", _transpose, trap="transpose"),
    Claim("§3.2", "`masked_fill(mask == 0, -inf)` then softmax puts weight 0 there",
          "`-inf`, with rows that have no allowed key zeroed", _fill_zero,
          trap="fully_masked_row"),
    Claim("§3.2", "without `dim=-1` softmax normalises over all elements",
          "`F.softmax(scores, dim=-1)`", _softmax_dim, trap="softmax_dim"),
    Claim("§3.2", "a (B, 1, T, T) mask broadcasts to (B, T, T)",
          "a (B, T, T) mask, or scores (B, h, T, T)", _mask_broadcast, trap="mask_rank"),
    Claim("§3.3", "the example prints output and weights of shape (1, 3, 3), lower-triangular",
          "a (B, T, T) mask for (B, T, T) scores", _example, where=TUTORIAL_CODE),
    Claim("§4.1", "`1 / math.sqrt(d_k)` loses precision: keep the scale a float32 tensor",
          "`scores / math.sqrt(d_k)`", _benign_claim, trap="scale_precision"),
    Claim("§4.2", "`masked_fill(mask.bool(), -1e9)` on a keep-mask fills the wrong positions",
          "`masked_fill(mask == 0, float('-inf'))`", _mask_bool, trap="mask_bool"),
    Claim("§4.3", "bmm needs the batch sizes to match (cross-attention)",
          "check both batches; expand a batch of 1 on purpose", _batch_contract,
          where=CLAIMS_HERE),
    Claim("§4.4", "V laid out as (B, d_v, T) breaks `weights @ V`",
          "V as (B, T, d_v)", _v_layout, trap="v_layout"),
    Claim("§4.5", "nn.Linear's default init makes Q K^T too large or too small: use xavier",
          "the default; avoid `normal_(std=1)`", _init, trap="init_variance",
          leads_to="init_unit_variance"),
    Claim("§5.1", "heads of width d_model / h keep the parameter count",
          "split with `view(B, T, h, d_k).transpose(1, 2)`", _head_parameters, where=CLAIMS_HERE,
          leads_to="head_split_view"),
    Claim("§5.2", "multi-head attention as a `ModuleList` of single heads",
          "one projection for all heads, heads as an axis", _head_loop, trap="head_loop"),
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


def scorecard_table(results: list[TrapResult]) -> pd.DataFrame:
    by_id = {r.pair.card.id: r for r in results}
    rows = []
    for claim in CLAIMS:
        holds, number = judged(claim, by_id)
        shown = link(claim.trap) if claim.trap else f"[below](#{claim.where})"
        instead = claim.instead + (f" (see {link(claim.leads_to)})" if claim.leads_to else "")
        rows.append({"§": claim.section, "the tutorial says": claim.says, "holds?": holds,
                     "the number that decides it": number, "write instead": instead,
                     "measured in": shown})  # fmt: skip
    return pd.DataFrame(rows)


def verdict_words() -> str:
    """What the scorecard's verdicts mean (the legend's words, less INCONCLUSIVE, which no
    pair's combined verdict is here)."""
    meanings = "; ".join(f"{v}, {m}" for v, m in MEANING.items() if v is not Verdict.INCONCLUSIVE)
    return prose(
        "The verdicts in *the number that decides it* are the measurement's, buggy.py against "
        f"fixed.py: {meanings}. Rounding noise is the floor, fixed.py's own error against "
        "float64 in the same dtype. An *output error* is the largest |difference| from fixed.py "
        "run in float64, in the output's own units."
    )


def scorecard(results: list[TrapResult]) -> str:
    """The scorecard section: the table, what its verdict words mean, how the rows no pair
    measures were measured."""
    parts = [SCORECARD, "", table(scorecard_table(results)), "", verdict_words(), ""]
    return "\n".join([*parts, claims_measured_here()])


def claims_measured_here() -> str:
    """How the rows measured here, not by a pair, were measured: beside the table."""
    text = (
        "The rows not measured by a pair (all on the CPU in float32, from seeded generators, "
        "by `harness/tutorial/claims.py`): §2, the standard deviation of q · k over 4,096 pairs "
        "of unit-variance vectors per d_k; §4.3, `bmm` and `@` on queries and keys whose batch "
        "sizes differ; §5.1, the weights of W_q, W_k, W_v and W_o counted both ways; §6.3, "
        "`exp(Q K^T / sqrt(d_k)) @ V` against `softmax(Q K^T / sqrt(d_k)) @ V` for "
        "unit-variance q, k, v (128 tokens, d_k 64), its largest error over the largest |value| "
        "of softmax's output, over ten seeds. Wall-clock speed is not in this file (it varies "
        'from run to run), so §6.3\'s "3x faster" is not judged here: the loss it pays is.'
    )
    return anchor(CLAIMS_HERE) + "\n" + prose(text)
