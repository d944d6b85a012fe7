"""Card for v_layout: V held as (B, d_v, T)."""

from harness.catalogue.card import Card, Verdict

CARD = Card(
    id="v_layout",
    title="V laid out as (batch, d_v, seq_len)",
    section="§4.4",
    category="layout",
    claim="V laid out as (batch, d_v, seq_len) breaks attn_weights @ V; use bmm.",
    trap="bmm(weights, V) with V as (B, d_v, T) instead of (B, T, d_v).",
    truth=(
        "bmm raises unless d_v == seq_len; then it runs and pairs attention weights with "
        "features instead of positions. bmm does not help: it fails the same way as @. The "
        "harness finds that trigger by search, smallest at d_v = seq_len = 2."
    ),
    why="A model whose d_v happens to equal the context length trains on scrambled values.",
    avoid="Keep every tensor as (B, T, features) and test with d_v != seq_len.",
    expected=Verdict.CONDITIONAL,
)
