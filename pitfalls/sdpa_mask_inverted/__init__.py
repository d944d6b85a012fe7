"""Card for sdpa_mask_inverted: an nn.MultiheadAttention mask given to SDPA."""

from harness.catalogue.card import Card, Verdict

CARD = Card(
    id="sdpa_mask_inverted",
    title="An nn.MultiheadAttention mask given to SDPA",
    section="—",
    category="masks",
    claim=(
        "Not named by the tutorial; the common belief: a bool mask means the same thing everywhere."
    ),
    trap=(
        "A True = blocked mask (nn.MultiheadAttention's convention) passed to "
        "F.scaled_dot_product_attention, where True = attend."
    ),
    truth=(
        "Every query attends exactly to the keys it should not; a row whose every key is "
        "allowed becomes all-blocked and SDPA returns 0 for it."
    ),
    why=(
        "Both calls accept the same bool tensor without complaint; the convention flips "
        "silently between two torch APIs."
    ),
    avoid="Convert at the boundary (attn_mask = ~blocked) and name masks by convention.",
    expected=Verdict.SILENT,
    mask="causal",
    convention="drop",
    sources=(
        "pytorch/pytorch#170400",
        "lucidrains/x-transformers#160",
        "NVIDIA/TransformerEngine#614",
    ),
)
