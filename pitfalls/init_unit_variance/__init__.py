"""Card for init_unit_variance: projection weights drawn with variance 1."""

from __future__ import annotations

from harness.catalogue.card import Card, Verdict
from harness.shapes import Shape

CARD = Card(
    id="init_unit_variance",
    title="Projection weights drawn with variance 1",
    section="—",
    category="initialisation",
    claim=(
        "Not named by the tutorial (its §4.5 blames nn.Linear's default, see init_variance); "
        "the common belief: weights drawn from a standard normal are a neutral start."
    ),
    trap="normal_(std=1) on the projections: Q K^T / sqrt(d_k) has a spread of about d_model.",
    truth=(
        "nn.Linear's default has variance 1/(3 fan_in) and xavier_uniform_ 2/(fan_in + fan_out), "
        "not 1/fan_in; both give healthy attention. A large init such as normal_(std=1) saturates "
        "the softmax: about 99% of rows put 0.99 of their weight on one key, so each query copies "
        "a single key. Its gradients are not small but erratic: seed by seed the W_q gradient norm "
        "ranges from under 0.01x to over 90x xavier's (init_variance's table of the three inits "
        "gives the mean over the seeds), and they flow through one key per query."
    ),
    why=(
        "Saturated attention cannot spread weight over several keys, and a near one-hot softmax "
        "passes almost no gradient to the keys it ignores: nothing raises, training stalls."
    ),
    avoid="Keep the default or xavier init; check the attention entropy at initialisation.",
    expected=Verdict.SILENT,
    shared_weights=False,
    shape=Shape(batch=4, seq_len=16, d_model=512, d_k=64, d_v=64),
)
