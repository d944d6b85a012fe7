"""Card for padding_on_queries: a key-padding mask broadcast over the queries."""

from harness.catalogue.card import Card, Verdict

CARD = Card(
    id="padding_on_queries",
    title="A key-padding mask broadcast over the queries",
    section="—",
    category="masks",
    claim=(
        "Not named by the tutorial; the common belief: a (B, T) padding mask can be unsqueezed "
        "either way."
    ),
    trap=(
        "mask[:, :, None] (blocks padded queries' rows) instead of mask[:, None, :] (blocks "
        "padded keys)."
    ),
    truth=(
        "Real queries still attend to padding tokens, and padded queries' rows become all -inf:"
        " NaN."
    ),
    why="Padding content leaks into every real token's representation.",
    avoid=(
        "A key-padding mask masks keys: broadcast it as (B, 1, T); test that no weight lands on"
        " a padded key."
    ),
    expected=Verdict.SILENT,
    mask="padding",
    convention="key_padding",
)
