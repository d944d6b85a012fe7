"""Card for cache_causal_alignment: a causal mask anchored top-left under a KV cache."""

from harness.catalogue.card import MODERN, Card, Verdict

CARD = Card(
    id="cache_causal_alignment",
    title="A causal mask anchored top-left under a KV cache",
    section="—",
    category="caches",
    claim=(
        "Not named by the tutorial; the common belief: is_causal=True (or tril) is the causal "
        "mask, whatever the number of cached keys."
    ),
    trap=(
        "With T new queries and S = cached + T keys, the (T, S) mask is tril() (anchored at the "
        "top-left, as SDPA's is_causal=True builds it) instead of tril(S - T)."
    ),
    truth=(
        "The full forward (T = S) is right, so training and a plain test pass; at the first "
        "decode step the new token sees only the first cached key."
    ),
    why=(
        "Generation with a cache silently differs from the model that was trained: the text "
        "degrades from the first generated token on."
    ),
    avoid=(
        "Anchor the mask at the bottom-right (tril(S - T), or SDPA with an explicit attn_mask "
        "when T != S) and test that prefill plus one-token steps equals the full forward."
    ),
    expected=Verdict.SILENT,
    mask="causal",
    convention="internal",
    scenario="decode",
    sources=("pytorch/pytorch#108108", "meta-llama/llama#899"),
    **MODERN,
)
