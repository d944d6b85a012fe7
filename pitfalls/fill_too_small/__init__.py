"""Card for fill_too_small: masking with -1e4."""

from harness.catalogue.card import Card, Verdict

CARD = Card(
    id="fill_too_small",
    title="Masking with -1e4",
    section="—",
    category="numerics",
    claim=(
        "Not named by the tutorial; the common belief: -1e4 is small enough to mask (the "
        "float16-safe choice)."
    ),
    trap="masked_fill(mask == 0, -1e4).",
    truth=(
        "Fine while logits are small; once logits fall below -1e4 (large activations), the "
        "masked keys outscore the allowed ones and leak back in."
    ),
    why="It passes every test on small inputs and breaks on a trained model's large activations.",
    avoid="Use float('-inf') or torch.finfo(dtype).min, never a hand-picked constant.",
    expected=Verdict.SILENT,
    mask="causal",
    edge="large",
    input_scale=300.0,
    sources=(
        "huggingface/transformers#14859",
        "huggingface/transformers PR #17306",
        "TransformerLens#318",
    ),
)
