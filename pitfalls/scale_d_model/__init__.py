"""Card for scale_d_model: multi-head scores divided by sqrt(d_model)."""

from harness.catalogue.card import Card, Verdict, multi_head
from harness.shapes import Shape

CARD = Card(
    id="scale_d_model",
    title="Multi-head scores divided by sqrt(d_model)",
    section="—",
    category="scale",
    claim=(
        "Not named by the tutorial; the common belief: one scale for the model: divide by "
        "sqrt(d_model)."
    ),
    trap="Each head's scores divided by sqrt(d_model) instead of sqrt(d_k = d_model / h).",
    truth=(
        "Logits shrink by sqrt(h): attention is flatter than it should be (entropy too high). "
        "With one head d_model = d_k and the bug vanishes, so tests must use several heads."
    ),
    why="Blurry attention silently weakens the model; single-head tests cannot see it.",
    avoid="Scale by the width of the vectors actually multiplied: q.size(-1).",
    expected=Verdict.SILENT,
    build=multi_head,
    has_heads=True,
    shape=Shape(batch=2, seq_len=5, d_model=16, d_k=4, d_v=4, heads=4),
)
