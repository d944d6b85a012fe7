"""Card for rope_on_value: rotary positions applied to the values as well."""

from harness.catalogue.card import MODERN, Card, Verdict

CARD = Card(
    id="rope_on_value",
    title="Rotary positions applied to the values",
    section="—",
    category="positions",
    claim=(
        "Not named by the tutorial; the common belief: rotary embedding encodes the position "
        "of every projection, so q, k and v are all rotated."
    ),
    trap=(
        "v is rotated by its position as q and k are, so every value carries its absolute "
        "position into the output."
    ),
    truth=(
        "The attention weights are fixed.py's exactly (q and k are rotated the same way); the "
        "outputs are not: on the full scenario (float32, 4 heads of width 8, 8 tokens) they "
        "differ from fixed.py's by 0.397 (relative L2 0.485). Shifting every position by 1,000 "
        "changes buggy.py's outputs by 0.901 and fixed.py's by float32 rounding only (at most "
        "64 ulps of their size: the angles round): the module no longer depends on relative "
        "positions only. CATALOGUE.md's 3.15 "
        "for a shift is not what this module gives: its outputs stay within 0.81."
    ),
    why=(
        "The same text gives other outputs when it moves (behind a longer prompt, in a packed "
        "row, past a cache offset), and weights trained without it are wrong with it; nothing "
        "raises, and a model trains with it (x-transformers rotated values until 1.20.0)."
    ),
    avoid=(
        "Rotate q and k only (RoFormer leaves the values alone); test that shifting every "
        "position by the same offset leaves the output unchanged."
    ),
    expected=Verdict.SILENT,
    mask="causal",
    convention="internal",
    sources=("lucidrains/x-transformers#182",),
    **MODERN,
)
