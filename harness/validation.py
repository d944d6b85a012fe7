"""The doctor validated on the catalogue, like a mutation score.

Each buggy.py is a hand-written mutant of its fixed.py. The doctor must flag (fail or warn on)
every buggy module whose verdict is not BENIGN and pass (exit 0) every fixed module, plus
torch's own nn.MultiheadAttention and a module built on F.scaled_dot_product_attention.
"""

from __future__ import annotations

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.catalogue.card import Card, Pair
from harness.catalogue.verdicts import Verdict
from harness.doctor import FAIL, WARN, Config, Diagnosis, diagnose
from harness.shapes import Shape

DOCTOR_SHAPE = Shape(batch=4, seq_len=8, d_model=64, d_k=16, d_v=16, heads=4)


def config_for(card: Card, **overrides: object) -> Config:
    """The doctor options a user of this card's modules would pass."""
    causal = card.convention == "internal"  # it masks by itself: the catalogue's causal modules
    return Config.for_spec(card.spec, causal=causal, **{**card.doctor, **overrides})


def build(pair: Pair, side: str) -> nn.Module:
    torch.manual_seed(0)
    module = pair.buggy if side == "buggy" else pair.fixed
    return pair.card.build(module, DOCTOR_SHAPE)


class SDPAAttention(nn.Module):
    """A reference module on F.scaled_dot_product_attention, keep convention (True = attend)."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        mask = None if mask is None else mask[:, None]  # (B, 1, T, T)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(out.transpose(1, 2).reshape(B, T, C))


DetectionRow = dict[str, object]  # a row of the detection table: one module, what the doctor said


def outcome(d: Diagnosis) -> str:
    statuses = {f.status for f in d.findings}
    return "flagged" if FAIL in statuses else "warned" if WARN in statuses else "passed"


def _flags(d: Diagnosis) -> str:
    return "; ".join(f"{f.probe}: {f.message}" for f in d.findings if f.status in (FAIL, WARN))


SHOWN_PROBES = 3  # a row names this many probes of each kind, then counts the rest


def _probes(d: Diagnosis) -> str:
    """Which probes fired: ``failed: a, b, c +2; warned: d``."""
    parts = []
    for status, label in ((FAIL, "failed"), (WARN, "warned")):
        names = [f.probe for f in d.findings if f.status == status]
        if names:
            more = len(names) - SHOWN_PROBES
            parts.append(
                f"{label}: {', '.join(names[:SHOWN_PROBES])}" + (f" +{more}" if more > 0 else "")
            )
    return "; ".join(parts)


# Mutants a warning kills by design, and why that is no failure.
WARNED_BY_DESIGN = {
    "fully_masked_row": "NaN on a row with no allowed key, which the fixed.py files that share "
    "that trap get too (a -inf fill, the fix of mask_bool)",
    "fill_overflow_half": "a -1e9 fill, right in float32, that raises under autocast to float16: "
    "a failure for a module declared to run in float16 (--dtype float16)",
}


def detection_markdown(table: pd.DataFrame) -> str:
    """The detection table for the report: which probes fired, and the mutation score."""
    mutants = table[table["should"] == "flag"]
    killed = int((mutants["doctor"] != "passed").sum())
    warned = "; ".join(
        f"`{trap}`, {WARNED_BY_DESIGN.get(trap, 'by a warning alone')}"
        for trap in (m.split("/")[0] for m in mutants[mutants["doctor"] == "warned"].module)
    )
    clean = table[table["should"] == "pass"]
    passed = int(clean["ok"].sum())
    lines = [
        "## The doctor on the catalogue",
        "",
        "Every buggy.py is a hand-written mutant of its fixed.py. `python -m harness doctor` "
        "ran its black-box probes on each (d_model 64, 4 heads where the module has heads, "
        "the mask convention the trap's modules use; for the modern pairs what their user knows "
        "and declares: relative positions, `--rope-pairing half`, `--kv-grouping blocks`, and "
        "`--packed` for packing; caches, windows and grouped heads are detected) and on two "
        "reference modules. A mutant is "
        "*killed* when a probe fails or warns; a fixed or reference module *passes* when no "
        "probe fails (warnings allowed, as the doctor's default). *should*: flag (a non-BENIGN "
        "buggy.py), pass (fixed.py, a reference) or either (a BENIGN buggy.py); *ok*: the "
        "doctor did what *should* says; *probes*: the ones that failed or warned (three named, "
        "+k more).",
        "",
        f"Mutation score: {killed}/{len(mutants)} non-BENIGN mutants killed"
        + (f" (only by a warning: {warned})" if warned else "")
        + f"; {passed}/{len(clean)} fixed and reference modules pass.",
        "",
        table[["module", "verdict", "should", "doctor", "ok", "probes"]].to_markdown(index=False),
        "",
        "A warning, not a failure, by design: NaN for a query with no allowed key "
        "(`fully_masked_row`). Float16 overflow of Q K^T at large activations "
        "(`qk_overflow_half`) fails only a module declared to run in float16 (`--dtype float16`, "
        "as that card's user knows): most fixed.py files compute (Q K^T) / sqrt(d_k) exactly "
        "like that buggy module, and for them it is a note under float16 robustness, since "
        "it says nothing about code that does not run in float16.",
    ]
    return "\n".join(lines)


def detection_rows(pair: Pair) -> list[DetectionRow]:
    """What the doctor said of one pair's modules: a row for its buggy.py, then its fixed.py."""
    rows = []
    for side in ("buggy", "fixed"):
        d = diagnose(build(pair, side), config_for(pair.card), f"{pair.card.id}/{side}.py")
        expected_flag = side == "buggy" and pair.card.expected is not Verdict.BENIGN
        said = outcome(d)
        ok = (said != "passed") if expected_flag else (d.exit_code == 0)
        rows.append(
            dict(
                module=d.target,
                verdict=str(pair.card.expected) if side == "buggy" else "fixed",
                should="flag" if expected_flag else ("pass" if side == "fixed" else "either"),
                doctor=said,
                ok=ok,
                probes=_probes(d),
                evidence=_flags(d),
            )
        )
    return rows


def reference_rows() -> list[DetectionRow]:
    """What the doctor said of the two reference modules, which must pass."""
    torch.manual_seed(0)
    references = [
        (
            "torch.nn.MultiheadAttention (drop)",
            nn.MultiheadAttention(64, 4, batch_first=True),
            Config(mask="drop"),
        ),
        ("SDPA module (keep)", SDPAAttention(64, 4), Config(mask="keep")),
    ]
    rows = []
    for name, module, config in references:
        d = diagnose(module, config, name)
        rows.append(
            dict(
                module=name,
                verdict="reference",
                should="pass",
                doctor=outcome(d),
                ok=d.exit_code == 0,
                probes=_probes(d),
                evidence=_flags(d),
            )
        )
    return rows
