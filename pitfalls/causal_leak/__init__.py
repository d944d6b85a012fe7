"""Card for causal_leak: a causal mask with the wrong diagonal."""

from harness.catalogue.card import Card, Verdict

CARD = Card(
    id="causal_leak",
    title="A causal mask with the wrong diagonal",
    section="—",
    category="masks",
    claim="Not named by the tutorial; the common belief: tril(..., diagonal=1) is the causal mask.",
    trap="torch.tril(ones(T, T), diagonal=1): each position also sees the next one.",
    truth=(
        "Position t attends to t + 1: the gradient-dependency check finds output t depending on"
        " input t + 1. Teacher-forced, the model can read the next token instead of predicting"
        " it: the learning probe's copy task shows it predicting prompt tokens no causal model"
        " can know."
    ),
    why=(
        "Teacher-forced training cannot tell; generation fails because the future is not there "
        "at inference."
    ),
    avoid=(
        "Build the mask with tril(ones(T, T)) (diagonal 0) and test by gradient dependency: the"
        " loss at position t must give zero gradient to inputs after t."
    ),
    expected=Verdict.SILENT,
    mask="causal",
    convention="internal",
    sources=(
        "rasbt/LLMs-from-scratch#1061",
        "Karpathy, A Recipe for Training Neural Networks (2019)",
    ),
)
