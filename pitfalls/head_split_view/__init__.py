"""Card for head_split_view: heads split with view(B, h, T, d_k)."""

from harness.catalogue.card import Card, Verdict, multi_head
from harness.catalogue.sources import source_table
from harness.shapes import Shape

CARD = Card(
    id="head_split_view",
    title="Heads split with view(B, h, T, d_k)",
    section="—",
    category="layout",
    claim="Not named by the tutorial; the common belief: view(B, h, T, d_k) splits the heads.",
    trap="x.view(B, h, T, d_k) instead of x.view(B, T, h, d_k).transpose(1, 2).",
    truth=(
        "The view reinterprets memory: each 'head' gets a slice mixing several positions' "
        "features. With one head the two are identical, so only multi-head tests see it."
    ),
    why=(
        "Nothing raises and the loss still falls, so the mixing is easy to miss; the learning "
        "probe shows it learning recall far more slowly than fixed.py."
    ),
    avoid=(
        "Split with view(B, T, h, d_k).transpose(1, 2) (or einops.rearrange) and test with h > 1."
    ),
    expected=Verdict.SILENT,
    build=multi_head,
    extra=source_table,
    has_heads=True,
    shape=Shape(batch=2, seq_len=5, d_model=16, d_k=4, d_v=4, heads=4),
    sources=(
        "jsbaan/transformer-from-scratch PR #6",
        "hackiey/QAnet-pytorch#2",
        "reczoo/FuxiCTR#30",
    ),
)
