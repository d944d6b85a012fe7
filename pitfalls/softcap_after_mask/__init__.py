"""Card for softcap_after_mask: tanh soft-capping applied after the mask, and what leaks."""

import pandas as pd
import torch

from harness.catalogue.card import MODERN, Card, Pair, Verdict
from harness.inputs import make_inputs
from harness.masks import causal_keep
from harness.runner import seeded
from harness.shapes import Shape

DEFAULT_CAP = 5.0  # Attention's default softcap (fixed.py, buggy.py)
GEMMA_CAP = 50.0  # Gemma-2's attn_logit_softcapping
CAPS = (1.0, DEFAULT_CAP, 10.0, 20.0, GEMMA_CAP)


def leak(
    pair: Pair, device: torch.device, dtype: torch.dtype, shape: Shape, cap: float
) -> dict[str, float]:
    """With soft-cap ``cap``, on the seed-0 draw of ``shape`` (causal), fixed.py's weights
    in buggy.py: the largest weight on a masked key, the largest share of a row's weight on
    masked keys, and the largest output difference."""
    modules = {}
    for side, module in (("fixed", pair.fixed), ("buggy", pair.buggy)):
        with seeded(0):
            modules[side] = module.Attention(
                shape.d_model, shape.heads, max(1, shape.heads // 2), softcap=cap
            )
    modules["buggy"].load_state_dict(modules["fixed"].state_dict())
    x = make_inputs(shape, 0).x.to(device, dtype)
    with torch.no_grad():
        (fix, _), (bug, weights) = (modules[s].to(device, dtype)(x) for s in ("fixed", "buggy"))
    blocked = ~causal_keep(shape.batch, shape.seq_len)[:, None]  # (B, 1, T, T)
    masked = weights.double().cpu().masked_fill(~blocked, 0.0)  # (B, h, T, T)
    return {
        "max weight on a masked key": masked.max().item(),
        "max masked share of a row": masked.sum(-1).max().item(),
        "max output difference": (bug - fix).abs().max().item(),
    }


def leak_table(pair: Pair, device: torch.device, dtype: torch.dtype) -> pd.DataFrame:
    """What buggy.py lets through the causal mask, per soft-cap value."""
    rows = [{"softcap": cap, **leak(pair, device, dtype, pair.card.shape, cap)} for cap in CAPS]
    table = pd.DataFrame(rows)
    table.attrs["caption"] = (
        f"Weight buggy.py puts on masked (future) keys, per soft-cap (default {DEFAULT_CAP:g}, "
        f"Gemma-2 {GEMMA_CAP:g}), causal, seed 0"
    )
    return table


CARD = Card(
    id="softcap_after_mask",
    title="Soft-capping applied after the mask",
    section="—",
    category="masks",
    claim=(
        "Not named by the tutorial; the common belief: soft-capping only bounds the scores, so "
        "it can go anywhere before the softmax, after the mask included."
    ),
    trap=(
        "softcap * tanh(scores / softcap) applied to the masked scores: tanh(-inf) = -1, so a "
        "blocked key's -inf becomes -softcap, a finite score that softmax gives weight to."
    ),
    truth=(
        "With the default softcap 5 a masked key gets up to 0.0097 of its row's weight and the "
        "first query, which should see only itself, gives up to 0.068 of its weight to future "
        "keys: output 0 depends on input 7 and the outputs are off by 0.040 in float32 (SILENT "
        "in every dtype). With softcap 1 a masked key gets up to 0.114 (the catalogue measured "
        "0.065 with cap 1 on a draw it does not record); with Gemma-2's 50 at most 3e-22, far "
        "below float32 rounding, as the flash-attention review expected for a large cap. The "
        "default 5 is chosen so the leak shows in every dtype while tanh barely bends this "
        "module's scores (the largest on the card's draw, 1.29, is capped to 1.26)."
    ),
    why=(
        "The model reads the future: training loss improves on information generation will not "
        "have, and padding leaks in. How much depends on the cap against the scores, so a model "
        "may pass at one cap and leak at another."
    ),
    avoid=(
        "Cap the raw scores, then mask (Gemma-2's order; flash-attention's softcap does the "
        "same), and test that no output depends on a later input."
    ),
    expected=Verdict.SILENT,
    mask="causal",
    convention="internal",
    extra=leak_table,
    sources=(
        "huggingface/transformers PR 32865",
        "Dao-AILab/flash-attention PR 1025",
        "onnx/onnx#7865",
    ),
    **MODERN,
)
