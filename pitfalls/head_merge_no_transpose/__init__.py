"""Card for head_merge_no_transpose: heads merged by reshape without transpose."""

from harness.catalogue.card import Card, Verdict, multi_head
from harness.catalogue.sources import source_table
from harness.shapes import Shape

CARD = Card(
    id="head_merge_no_transpose",
    title="Heads merged by reshape without transpose",
    section="—",
    category="layout",
    claim=(
        "Not named by the tutorial; the common belief: reshape(B, T, d_model) merges the heads "
        "back."
    ),
    trap="out.reshape(B, T, h * d_k) on a (B, h, T, d_k) tensor, without transpose(1, 2) first.",
    truth=(
        "The reshape reads head-major memory as position-major: positions are scrambled across "
        "the output. Invisible with one head."
    ),
    why=(
        "Like the split bug, nothing raises and the loss still falls, so it hides; single-head "
        "tests cannot see it, and the learning probe shows it learning more slowly."
    ),
    avoid="out.transpose(1, 2).reshape(B, T, d_model), and test with h > 1.",
    expected=Verdict.SILENT,
    build=multi_head,
    extra=source_table,
    has_heads=True,
    shape=Shape(batch=2, seq_len=5, d_model=16, d_k=4, d_v=4, heads=4),
    sources=("jsbaan/transformer-from-scratch PR #6",),
)
