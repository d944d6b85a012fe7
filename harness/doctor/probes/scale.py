"""The factor on a module's scores, measured from its attention weights: for a module whose
position bias SDPA cannot add (T5's learned buckets, ALiBi's slopes, Swin's bias table), whose
scale would otherwise go unchecked.

The weights come out of the module's own output: what enters its output projection is P v per
head, so P = out v⁺ while a sequence is no longer than a head is wide. A module that computes
softmax(s q k^T + B) v with a bias B of positions alone has, on two inputs x1 and x2 at the same
positions, log P1 - log P2 = s (q1 k1^T - q2 k2^T) plus a constant per row: s is that line's
slope, and a fit that leaves more than rounding says the module is something else (the bias
reads its input, the heads merge otherwise), which is then not compared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from harness.doctor.findings import Outcome, failed, passed
from harness.doctor.probes.inside import projection_input, submodule_name
from harness.doctor.subject import Subject
from harness.reference import Recognized, split_heads

MIN_WEIGHT = 1e-3  # lighter weights are left out of the fit: their logarithm is mostly rounding
MISFIT = 1e-3  # the most log P may stray from the fitted line: float32 weights stray ~1e-6
SAME = 0.01  # |log(measured / meant)| within which a scale is the one meant; the forms it is
# told apart from differ by a factor of sqrt(d_k) >= sqrt(2) (log 0.35) or more
SEEDS = (41, 43)  # the two inputs
ROW_SUM = MISFIT  # how far from 1 a row of weights may sum: as far as its log may stray


@dataclass(frozen=True)
class Measured:
    """The factor ``scale`` a module puts on q k^T of its projections (``described``), and how
    far its log-weights strayed from that line (``misfit``); heads of width ``d_k``."""

    scale: float
    misfit: float
    d_k: int
    described: str
    row_sum: float = 1.0  # what a row of its weights sums to (the median row)


def weights(out: Tensor, v: Tensor) -> Tensor:
    """The (B, h, T, T) weights P with out = P v, per head: out (B, h, T, d_v), v (B, h, T, d_v),
    solved exactly while T <= d_v (v's rows then independent)."""
    solution = torch.linalg.lstsq(v.transpose(-2, -1), out.transpose(-2, -1)).solution
    return solution.transpose(-2, -1)  # (B, h, T, T)


def fit(log_p: Tensor, scores: Tensor, valid: Tensor) -> tuple[float, float]:
    """(slope, misfit) of ``log_p`` = slope * ``scores`` + a constant per row, over the
    ``valid`` entries (each (B, h, T, T)): least squares after taking each row's mean away."""
    count = valid.sum(-1, keepdim=True).clamp(min=1)

    def centred(t: Tensor) -> Tensor:
        t = t.masked_fill(~valid, 0.0)
        return (t - t.sum(-1, keepdim=True) / count).masked_fill(~valid, 0.0)

    y, z = centred(log_p), centred(scores)
    spread = (z * z).sum()
    if spread <= 0:
        return math.nan, math.inf
    slope = ((y * z).sum() / spread).item()
    return slope, (y - slope * z).abs().max().item()


def _heads(out: Tensor, heads: int) -> Tensor:
    """(B, T, h d) -> (B, h, T, d): the heads merged back as attention merges them."""
    B, T, _ = out.shape
    return out.reshape(B, T, heads, -1).transpose(1, 2)


def _measure(subject: Subject, module: nn.Module, reading: Recognized,
             seq_len: int) -> Measured | None:  # fmt: skip
    """The scale read off ``reading``'s projections (of ``module``, a copy) at ``seq_len``
    tokens, or None."""
    cfg = subject.config
    name = None if reading[1] is None else submodule_name(module, reading[1])
    if reading[1] is not None and name is None:
        return None
    keep = subject.ordinary_keep(cfg.batch, seq_len)
    strided = subject.kv_grouping == "strided"
    log_ps, scores, valid, sums = [], [], None, []
    for seed in SEEDS:
        x = subject.x(cfg.batch, seq_len, seed)
        if name is None:
            with torch.no_grad():
                out = subject.call(module, x, keep)[0]
        else:
            out = projection_input(subject, module, name, x, keep)
        with torch.no_grad():
            q, k, v = split_heads(reading, x, tile_kv=strided)
        if out is None or out.shape[-1] != v.shape[1] * v.shape[-1] or v.shape[-1] < seq_len:
            return None
        if not (torch.isfinite(out).all() and torch.isfinite(v).all()):
            return None  # nothing to solve for (and LAPACK would complain on stdout)
        p = weights(_heads(out.double(), q.shape[1]), v.double())  # (B, h, T, T)
        sums.append(p.sum(-1).flatten())
        kept = (p > MIN_WEIGHT) & torch.isfinite(p)
        valid = kept if valid is None else valid & kept
        log_ps.append(p.clamp(min=MIN_WEIGHT).log())
        scores.append((q @ k.transpose(-2, -1)).double())  # (B, h, T, T), unscaled
    assert valid is not None
    slope, misfit = fit(log_ps[0] - log_ps[1], scores[0] - scores[1], valid)
    if not misfit <= MISFIT or not slope > 0:
        return None
    row_sum = torch.cat(sums).median().item()
    return Measured(slope, misfit, q.shape[-1], reading[3], row_sum)


def measure(subject: Subject) -> Measured | None:
    """The factor the module puts on q k^T, measured from its weights; None when its
    projections are not recognized or its weights are not softmax(s q k^T + B) with B the same
    for every input."""
    cfg = subject.config
    module = subject.copy()
    for reading in subject.recognized(module, extra=True):
        with torch.no_grad():
            head_width = reading[0](subject.x(1, 1, 0))[2].shape[-1] // reading[2]
        seq_len = min(cfg.seq_len, head_width)
        found = None if seq_len < 3 else _measure(subject, module, reading, seq_len)
        if found is not None:
            return found
    return None


# T5's bucketed position bias: attention that holds it is unscaled by design (Mesh TensorFlow
# folds 1/sqrt(d) into the query projection's initialisation), as in every T5-style code base
T5_BIAS = "relative_attention_bias"


def unscaled_by_design(module: nn.Module) -> bool:
    """The module holds T5's ``relative_attention_bias`` (an embedding of position buckets)."""
    return any(name.rsplit(".", 1)[-1] == T5_BIAS for name, _ in module.named_modules())


def judged(subject: Subject, found: Measured) -> Outcome:
    """A pass when the measured scale is the one meant (--scale, else 1 for T5's bucketed
    attention, else 1/sqrt(d_k)); else a
    failure naming the known wrong form it is, when it is one."""
    unscaled = subject.config.scale is None and unscaled_by_design(subject.original)
    meant = subject.config.scale or (1.0 if unscaled else found.d_k**-0.5)
    said = (f"--scale {meant:.4g}" if subject.config.scale
            else f"1 (T5's {T5_BIAS}: unscaled by design)" if unscaled
            else f"1/sqrt({found.d_k}) = {meant:.4g}")  # fmt: skip
    forms = (
        (meant, "", ""),
        (meant * found.d_k**-0.5, "the scale applied twice (1/sqrt(d_k) on top of it)",
         "double_scale"),
        (1.0, "no scale at all", "missing_scale"),
        (subject.d_model**-0.5, f"1/sqrt(d_model) = 1/sqrt({subject.d_model})", "scale_d_model"),
    )  # fmt: skip
    if abs(found.row_sum - 1) > ROW_SUM:
        after = abs(math.log(found.row_sum * math.sqrt(found.d_k))) <= SAME
        named = ": the scale applied after the softmax: scale_after_softmax" if after else ""
        return failed(
            f"its weights' rows sum to {found.row_sum:.4g}, not 1 (its weights read off its "
            f"output on {found.described}){named}",
            *(("scale_after_softmax",) if after else ()),
        )
    scale, words, trap = min(forms, key=lambda form: abs(math.log(found.scale / form[0])))
    how = (
        f"its weights are softmax(s q k^T + B) with a bias B of positions alone (fitted on two "
        f"inputs within {found.misfit:.1g} in log-weight) on {found.described}, and s = "
        f"{found.scale:.4g}"
    )
    if abs(math.log(found.scale / scale)) > SAME:
        return failed(f"{how}, where {said} is meant: no known trap's scale")
    if not trap:
        return passed(f"{how}, the {said} meant (SDPA cannot add the bias: compared this way)")
    return failed(f"{how}, where {said} is meant: {words}: {trap}", trap)
