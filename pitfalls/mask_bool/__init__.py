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
    trap="masked_fill(mask.bool(), -inf) on a keep-mask blocks exactly the keys it should keep.",
    truth=(
        "True. With a causal keep-mask every query attends only to its future and the last query, "
        "whose every key is blocked, becomes a NaN row (with -1e9 instead of -inf it becomes "
        "uniform instead: still wrong, no longer visible)."
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
