"""Card for rope_cache_offset: rotary positions restart at 0 on every cached call."""

from harness.catalogue.card import MODERN, Card, Verdict

CARD = Card(
    id="rope_cache_offset",
    title="Rotary positions restart at 0 on every cached call",
    section="—",
    category="positions",
    claim=(
        "Not named by the tutorial; the common belief: the default positions arange(T) are the "
        "tokens' positions, so a module that rotates by them is right in generation too."
    ),
    trap=(
        "The default positions are arange(T) on every call instead of starting at len(cache): "
        "under a KV cache each decoded token is rotated as position 0 while its cached keys "
        "keep positions 0..S-2."
    ),
    truth=(
        "Measured on the decode scenario (prefill of 4 tokens, then one token per call; B=2, "
        "T=8, 4 query heads, 2 K/V heads, seed 0): the prefill is exact and every decoded token "
        "is wrong, by 0.0881 at the first decode step falling to 0.0358 at the last in float32 "
        "(bfloat16 0.0873, float16 0.0882, far above each dtype's rounding floor). Chunked "
        "prefill is "
        "off by 0.0806; the full forward, one call from position 0, is untouched."
    ),
    why=(
        "Training, evaluation and every uncached test run the full forward, where the bug "
        "cannot show; generation then sees the newest token at the wrong distance from the "
        "context, and the text degrades with no error."
    ),
    avoid=(
        "Take the default positions from the cache (len(cache) + arange(T)), or require "
        "explicit positions under a cache, and test that prefill plus one-token steps gives "
        "the full forward."
    ),
    expected=Verdict.SILENT,
    mask="causal",
    convention="internal",
    scenario="decode",
    sources=("lucidrains/rotary-embedding-torch#11", "pytorch/executorch PR 2010"),
    **MODERN,
)
