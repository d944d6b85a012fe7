"""Card for mask_bool: a keep-mask filled where it says keep."""

from harness.catalogue.card import Card, Verdict

CARD = Card(
    id="mask_bool",
    title="A keep-mask inverted by mask.bool()",
    section="§4.2",
    category="masks",
    claim=(
        "With a keep-mask (1 = attend), masked_fill(mask.bool(), -1e9) fills the wrong "
        "positions; use masked_fill(mask == 0, float('-inf'))."
    ),
    trap="masked_fill(mask.bool(), -1e9) on a keep-mask blocks exactly the keys it should keep.",
    truth=(
        "True. With a causal keep-mask every query attends only to its future, and the last "
        "query, whose every key is blocked, comes out uniform with the tutorial's -1e9: still "
        "wrong, and nothing shows it (with -inf instead of -1e9 that row is NaN). In float16 "
        "the -1e9 fill itself raises (fill_overflow_half)."
    ),
    why=(
        "A mask convention mix-up raises nothing; the model trains on the wrong context. "
        "SDPA and nn.MultiheadAttention use opposite bool conventions (pytorch #170400)."
    ),
    avoid=(
        "Name the convention in the argument (keep_mask / blocked_mask) and test that a query "
        "never receives weight from a blocked key."
    ),
    expected=Verdict.SILENT,
    mask="causal",
    convention="keep",
    sources=("pytorch/pytorch#170400", "rasbt/LLMs-from-scratch#1061"),
)
