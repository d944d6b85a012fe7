"""Card for sdpa_float_mask: a 0/1 float mask given to SDPA."""

from harness.catalogue.card import Card, Verdict

CARD = Card(
    id="sdpa_float_mask",
    title="A 0/1 float mask given to SDPA",
    section="—",
    category="masks",
    claim="Not named by the tutorial; the common belief: a 0/1 float mask works like a bool mask.",
    trap=(
        "A float keep-mask (1.0 = attend, 0.0 = blocked) passed to F.scaled_dot_product_attention."
    ),
    truth=(
        "A float attn_mask is added to the scores: allowed keys get +1, blocked keys +0, so "
        "nothing is blocked and the future leaks."
    ),
    why="No error, no NaN; attention just ignores the mask.",
    avoid="Pass a bool mask (mask.bool()) or an additive mask of 0 and -inf.",
    expected=Verdict.SILENT,
    mask="causal",
    convention="keep_float",
    sources=("pytorch/pytorch#103963", "huggingface/transformers#542"),
)
