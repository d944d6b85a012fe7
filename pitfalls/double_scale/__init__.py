"""Card for double_scale: queries scaled by 1/sqrt(d) twice, and how flat attention gets."""

import copy
import math

import pandas as pd
import torch

from harness.catalogue.card import MODERN, Card, Pair, Verdict
from harness.inputs import make_inputs
from harness.masks import causal_keep
from harness.metrics import attention_stats
from harness.runner import seeded
from harness.shapes import MODERN_SHAPE, Shape

# Where the entropy is measured: the card's own shape, and heads as wide as Llama's (d = 64).
WIDE = Shape(batch=2, seq_len=64, d_model=256, d_k=64, d_v=64, heads=4)
# W_q and W_k at nn.Linear's default init (q, k entries of variance 1/3 for unit inputs), and
# times sqrt(3): q and k of unit variance, as the catalogue's figures take them.
GAINS = {"nn.Linear init": 1.0, "unit-variance q, k": math.sqrt(3.0)}


def entropies(
    pair: Pair, device: torch.device, dtype: torch.dtype, shape: Shape, gain: float
) -> dict[str, float]:
    """Mean normalized attention entropy of fixed.py and buggy.py (same weights, W_q and W_k
    times ``gain``) on the seed-0 draw of ``shape``, causal."""
    found, state = {}, None
    for side, module in (("fixed", pair.fixed), ("buggy", pair.buggy)):
        with seeded(0):
            attention = pair.card.build(module, shape)
        state = state or copy.deepcopy(attention.state_dict())  # fixed.py's weights, in both
        attention.load_state_dict(state)
        with torch.no_grad():
            attention.W_q.weight *= gain
            attention.W_k.weight *= gain
            x = make_inputs(shape, 0).x.to(device, dtype)
            _, weights = attention.to(device, dtype)(x)  # (B, h, T, T)
        keep = causal_keep(shape.batch, shape.seq_len)
        found[side] = attention_stats(weights.cpu().double(), keep)["entropy_mean"]
    return found


def entropy_table(pair: Pair, device: torch.device, dtype: torch.dtype) -> pd.DataFrame:
    """Mean normalized entropy, fixed.py and buggy.py, per shape and init scale."""
    rows = []
    for label, shape in (("card shape (d = 8, T = 8)", MODERN_SHAPE), ("d = 64, T = 64", WIDE)):
        for init, gain in GAINS.items():
            found = entropies(pair, device, dtype, shape, gain)
            rows.append({"shape": label, "W_q, W_k": init, **found})
    table = pd.DataFrame(rows)
    table.attrs["caption"] = (
        "Mean normalized attention entropy (1 = uniform over the allowed keys), causal, seed 0"
    )
    return table


CARD = Card(
    id="double_scale",
    title="Queries scaled by 1/sqrt(d) twice",
    section="—",
    category="scale",
    claim=(
        "Not named by the tutorial; the common belief: F.scaled_dot_product_attention(q, k, v) "
        "takes the scores as given, so a q already multiplied by 1/sqrt(d) (as OPT's q_proj "
        "output is) is scaled once."
    ),
    trap=(
        "q is scaled by 1/sqrt(d) up front and the product is scaled again, as SDPA does by "
        "default (scale=None means 1/sqrt(d)): the scores are divided by d instead of sqrt(d)."
    ),
    truth=(
        "Every score is sqrt(d) times too small, so attention flattens toward uniform: on the "
        "card's draw the mean normalized entropy goes from 0.972 to 0.996 (d = 8, nn.Linear's "
        "init, whose small q and k leave even fixed.py's attention nearly flat) and the outputs "
        "are off by 0.174 in float32 (the same in bfloat16 and float16). With unit-variance q "
        "and k and d = 64, T = 64 (the table below) it goes from 0.863 to 0.998: the case behind "
        "the catalogue's 0.868 -> 0.998, another draw."
    ),
    why=(
        "Nothing raises and the output keeps its shape and range: a checkpoint trained with one "
        "scale runs under two and answers worse, which only a comparison of the SDPA path "
        "against the eager one shows (how OPT's was found)."
    ),
    avoid=(
        "Scale exactly once: pass scale=1.0 to SDPA when q is pre-scaled (or drop the pre-scale),"
        " and compare the SDPA path against a written-out reference with the same weights."
    ),
    expected=Verdict.SILENT,
    mask="causal",
    convention="internal",
    extra=entropy_table,
    sources=("huggingface/transformers PR 38290", "huggingface/transformers PR 44397"),
    **MODERN,
)
