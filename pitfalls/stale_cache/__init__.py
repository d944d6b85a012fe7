"""Card for stale_cache: a KV cache zeroed in place by reset() instead of emptied."""

from harness.catalogue.card import MODERN, Card, Verdict

CARD = Card(
    id="stale_cache",
    title="A KV cache zeroed in place instead of emptied",
    section="—",
    category="caches",
    claim=(
        "Not named by the tutorial; the common belief: zeroing the cached keys and values "
        "resets the cache as well as dropping them does, and saves reallocating them."
    ),
    trap=(
        "reset() zeroes the cached tensors in place (k.zero_(), v.zero_()) instead of dropping "
        "them: the cache keeps the old prompt's length, so the next prompt is appended after "
        "that many zero keys with zero values."
    ),
    truth=(
        "Measured on the reuse scenario (decode another 8-token prompt, reset, then decode this "
        "one; B=2, T=8, 4 query heads, 2 K/V heads, seed 0): after reset() len(cache) is still "
        "8; every query of the new prompt gives each of the 8 zero keys the weight of a score "
        "0 and reads zero values from them, so its output is diluted: off by 0.727 at the first "
        "token, 0.142 at the last, in float32 (bfloat16 0.728, float16 0.727). A fresh cache "
        "is exact: the decode and chunked scenarios stay within the floor."
    ),
    why=(
        "The first prompt after loading the model is right, and so is every test that builds a "
        "new cache; the damage starts with the second prompt served by the same instance."
    ),
    avoid=(
        "Make reset() drop the tensors (or reset the length counter a preallocated cache "
        "indexes by), and test a reused instance against a fresh one."
    ),
    expected=Verdict.SILENT,
    mask="causal",
    convention="internal",
    scenario="reuse",
    sources=(
        "Lightning-AI/litgpt PR 83",
        "Lightning-AI/litgpt PR 1596",
        "huggingface/transformers#36536",
    ),
    **MODERN,
)
