"""Card for init_variance: projection weights drawn with variance 1."""

from harness.extras import init_table
from harness.shapes import Shape
from harness.verdicts import Verdict
from pitfalls import Card

CARD = Card(
    id="init_variance",
    title="Initialisation variance of W_q, W_k, W_v",
    section="§4.5",
    category="initialisation",
    claim=(
        "nn.Linear's default kaiming_uniform_ makes QK^T too large or too small; use "
        "xavier_uniform_, 'whose variance is 1/fan_in'."
    ),
    trap="normal_(std=1) on the projections: Q K^T / sqrt(d_k) has a spread of about d_model.",
    truth=(
        "nn.Linear's default has variance 1/(3 fan_in) and xavier_uniform_ 2/(fan_in + fan_out), "
        "not 1/fan_in; both give healthy attention. A large init such as normal_(std=1) saturates "
        "the softmax: about 99% of rows put 0.99 of their weight on one key, so each query copies "
        "a single key. Its gradients are not small (the W_q gradient is some 20x larger than with "
        "xavier) but they flow through one key per query."
    ),
    why=(
        "Saturated attention cannot spread weight over several keys, and a near one-hot softmax "
        "passes almost no gradient to the keys it ignores: nothing raises, training stalls."
    ),
    avoid="Keep the default or xavier init; check the attention entropy at initialisation.",
    expected=Verdict.SILENT,
    shared_weights=False,
    shape=Shape(batch=4, seq_len=16, d_model=512, d_k=64, d_v=64),
    extra=init_table,
)
