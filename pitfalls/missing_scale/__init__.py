"""Card for missing_scale: no division by sqrt(d_k)."""

from harness.extras import scale_sweep
from harness.verdicts import Verdict
from pitfalls import Card

CARD = Card(
    id="missing_scale",
    title="No division by sqrt(d_k)",
    section="—",
    category="scale",
    claim=(
        "Not named by the tutorial; the common belief: the scale is optional: softmax(Q K^T) V "
        "works."
    ),
    trap="scores = Q K^T with no / sqrt(d_k).",
    truth=(
        "q . k has variance d_k times that of one product, so unscaled logits spread like "
        "sqrt(d_k): the softmax sharpens as d_k grows (mean normalized entropy 0.87 at d_k 8, "
        "0.24 at d_k 256, against 0.98 with the scale). The catalogue expects starved "
        "gradients; measured up to d_k 256, the W_q gradient instead grows about 5x, since "
        "nothing divides it by sqrt(d_k) either: starvation needs saturated rows, and only 13% "
        "saturate at d_k 256."
    ),
    why=(
        "It trains, just worse, and worse the wider the heads: nothing points at the missing "
        "line. The Annotated Transformer gives the scale's reason: q . k has variance d_k."
    ),
    avoid="Divide by math.sqrt(d_k), or use F.scaled_dot_product_attention, which scales for you.",
    expected=Verdict.SILENT,
    extra=scale_sweep,
    sources=("The Annotated Transformer, 'Attention'",),
)
