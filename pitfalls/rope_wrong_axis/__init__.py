"""Card for rope_wrong_axis: rotary angles indexed along the heads axis instead of positions."""

from harness.catalogue.card import MODERN, Card, Verdict

CARD = Card(
    id="rope_wrong_axis",
    title="Rotary angles indexed along the heads axis",
    section="—",
    category="positions",
    claim=(
        "Not named by the tutorial; the common belief: a rotary helper works on any tensor "
        "whose last axes are (tokens, width), and a wrong layout would fail to broadcast."
    ),
    trap=(
        "q and k are rotated in Meta's (B, T, h, d) layout by a helper written for "
        "(B, h, T, d) that reads the token count from x.shape[-2] and cuts its angle table to "
        "it (as xformers' RotaryEmbedding did): head j of every token gets position j's angle."
    ),
    truth=(
        "It raises only when 1 < T < h (with 4 heads: calls of 2 or 3 tokens); at the "
        "measurement shape (4 heads, 8 tokens), with one head and in one-token decode steps "
        "it runs. Each head then has one rotation for every token, so the module is "
        "position-blind: swapping tokens 0 and 1 changes the outputs at t >= 2 by float32 "
        "rounding only (at most 64 ulps of their size; exactly 0 on some CPUs), against 0.089 "
        "with fixed.py; on the full scenario the outputs "
        "differ from fixed.py's by 0.067 (float32). A one-token decode step, though, rotates "
        "every head by that token's real position: a model trained on full forwards meets "
        "rotations in generation it never saw, which the learning probe's by-generation "
        "accuracy shows. CATALOGUE.md's 0.295 and 1.7e-16 are not "
        "what this module gives (other weights and inputs; float32 here)."
    ),
    why=(
        "The model trains and runs, but only the causal mask tells it word order: quality "
        "drops with no error, as open_lm's loss curves did until the axis was fixed."
    ),
    avoid=(
        "Keep one layout per function and check it (x.size(-2) == positions.size(-1)), or "
        "index the table by explicit positions; test that swapping two early tokens changes "
        "later outputs."
    ),
    expected=Verdict.SILENT,
    mask="causal",
    convention="internal",
    sources=("facebookresearch/xformers#841", "mlfoundations/open_lm#4"),
    **MODERN,
)
