"""Card for fully_masked_row: -inf fill on a query with no allowed key."""

from harness.catalogue.card import Card, Verdict

CARD = Card(
    id="fully_masked_row",
    title="-inf fill on a query with no allowed key",
    section="—",
    category="masks",
    claim="Not named by the tutorial; the common belief: masked_fill(-inf) is always safe.",
    trap="masked_fill(mask == 0, -inf) when a whole sequence is padding.",
    truth=(
        "Fine on ordinary batches; a query with no allowed key gets softmax(all -inf) = 0/0 = "
        "NaN. The catalogue says the NaN reaches every parameter's gradient; measured, it fills "
        "W_v's whole gradient (and the inputs'), while W_q and W_k stay finite because "
        "masked_fill's backward zeroes the gradient at every filled score. One optimizer step "
        "then turns W_v, and so every output, into NaN."
    ),
    why="One empty sequence in a batch makes the loss NaN and W_v's gradient NaN with it.",
    avoid=(
        "Fill with torch.finfo(dtype).min and zero the weights of blocked keys (as SDPA's safe "
        "softmax returns 0 for such rows), or drop empty sequences."
    ),
    expected=Verdict.NUMERIC,
    mask="padding",
    edge="empty_row",
    sources=("pytorch/pytorch#41508", "pytorch/pytorch#103749", "pytorch/pytorch#109517"),
)
