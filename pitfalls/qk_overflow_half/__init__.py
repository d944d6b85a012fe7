"""Card for qk_overflow_half: q K^T overflowing float16 before the scale."""

from harness.catalogue.card import Card, Verdict
from harness.shapes import Shape

CARD = Card(
    id="qk_overflow_half",
    title="Q K^T overflowing float16 before the scale",
    section="—",
    category="numerics",
    claim=(
        "Not named by the tutorial; the common belief: where the scale is applied does not matter."
    ),
    trap="(Q @ K^T) / sqrt(d_k) in float16 with large activations.",
    truth=(
        "Q K^T passes 65504 and becomes inf before the division: NaN. Scaling Q first keeps the"
        " product in range; float32 and bfloat16 have the range and never overflow here."
    ),
    why="Mixed-precision training produces NaN on the first large activation.",
    avoid="Scale Q (or Q and K by d_k ** -0.25) before the product, or upcast the product.",
    expected=Verdict.NUMERIC,
    edge="large",
    input_scale=150.0,
    shape=Shape(batch=2, seq_len=6, d_model=64, d_k=64, d_v=16),
    sources=("stanford-crfm/mistral#66", "huggingface/transformers PR #13573"),
    doctor={"dtype": "float16"},  # what its user knows: it runs in float16 with large activations
)
