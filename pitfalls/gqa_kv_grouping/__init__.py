"""Card for gqa_kv_grouping: K/V heads expanded by tiling instead of repeat_interleave."""

from harness.catalogue.card import MODERN, Card, Verdict

CARD = Card(
    id="gqa_kv_grouping",
    title="Grouped K/V heads expanded by tiling",
    section="—",
    category="heads",
    claim=(
        "Not named by the tutorial; the common belief: repeat and repeat_interleave both give "
        "every query head a K/V head, so either will do."
    ),
    trap=(
        "k.repeat(1, n_rep, 1, 1) where k.repeat_interleave(n_rep, dim=1) is meant: query head i "
        "reads K/V head i % n_kv_heads instead of i // n_rep."
    ),
    truth=(
        "Every query head still gets a K/V head of the right shape, so nothing raises; but with "
        "two or more K/V heads each shared by two or more query heads, half of the query heads "
        "read another head's keys and values: K/V head 0 reaches query heads 0 and 2 instead "
        "of 0 and 1."
    ),
    why=(
        "Weights trained (or converted) for one grouping give plausible but wrong outputs under "
        "the other; with one K/V head (multi-query) or one query head per K/V head it hides."
    ),
    avoid=(
        "Expand with repeat_interleave on the head axis (or let SDPA's enable_gqa do it) and "
        "test against multi-head attention built with the K/V weights repeat-interleaved."
    ),
    expected=Verdict.SILENT,
    mask="causal",
    convention="internal",
    sources=("huggingface/transformers PR 37533", "vllm-project/vllm PR 24701"),
    **MODERN,
)
