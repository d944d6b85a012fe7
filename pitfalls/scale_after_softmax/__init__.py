"""Card for scale_after_softmax: the scale applied after softmax."""

from harness.catalogue.card import Card, Verdict

CARD = Card(
    id="scale_after_softmax",
    title="The scale applied after softmax",
    section="—",
    category="scale",
    claim="Not named by the tutorial; the common belief: the scale can go anywhere.",
    trap="weights = softmax(Q K^T) / sqrt(d_k).",
    truth=(
        "Dividing after the softmax does not change which keys win; it shrinks every row to sum"
        " to 1/sqrt(d_k), so the output is scaled down and the logits are never tempered."
    ),
    why=(
        "Every output is sqrt(d_k) times smaller than its own (untempered) weights would give, "
        "and later layers compensate badly; rows no longer sum to 1."
    ),
    avoid="Scale the logits, before the softmax; check that attention rows sum to 1.",
    expected=Verdict.SILENT,
)
