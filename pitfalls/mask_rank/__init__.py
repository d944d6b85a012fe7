"""Card for mask_rank: the tutorial's own causal example, with a 4-D mask on 3-D scores."""

from harness.catalogue.card import Card, Verdict

CARD = Card(
    id="mask_rank",
    title="A (1, 1, T, T) causal mask on (B, T, T) scores",
    section="§3.3",
    category="masks",
    claim="causal_mask = torch.tril(torch.ones(1, 1, 3, 3)) applied to 3-D scores gives (1, 3, 3).",
    trap="masked_fill with a 4-D mask broadcasts the 3-D scores to 4-D.",
    truth=(
        "The example crashes: the weights become (1, B, T, T) and bmm raises 'batch1 must be a 3D "
        "tensor'. With @ instead of bmm it would run and silently return (1, B, T, d_v), for "
        "every batch size: the right values under an extra leading dimension."
    ),
    why="The tutorial's printed shapes cannot come from its code; readers copy the mask shape.",
    avoid="Build the mask with the rank of the scores, or assert scores.shape after masking.",
    expected=Verdict.LOUD,
    mask="causal",
    convention="internal",
)
