"""Card for softmax_dim: softmax without dim=-1."""

from harness.catalogue.card import Card, Verdict

CARD = Card(
    id="softmax_dim",
    title="Softmax without dim=-1",
    section="§3.2",
    category="masks",
    claim="Without dim=-1, softmax normalizes over all elements.",
    trap="F.softmax(scores) with no dim on (B, T, T) scores.",
    truth=(
        "It does not normalize over all elements: for a 3-D tensor the implicit dim is 0, the "
        "batch axis (with a deprecation warning). Batch elements mix. Under the tutorial's "
        "causal mask a blocked cell is -inf in every batch element, so softmax over the batch "
        "gives NaN there: every row but the last holds NaN (4 of 5 rows at T = 5), in the "
        "weights and the output; with batch 1 every allowed weight is exactly 1.0."
    ),
    why=(
        "Only a warning is printed; the module runs, its rows do not sum to 1 and one example's "
        "attention depends on the others in the batch."
    ),
    avoid="Always pass dim=-1, and check that attention rows sum to 1.",
    expected=Verdict.SILENT,
    mask="causal",
    convention="keep",
    sources=(
        "labmlai/annotated_deep_learning_paper_implementations#146",
        "PetrochukM/PyTorch-NLP#2",
    ),
)
