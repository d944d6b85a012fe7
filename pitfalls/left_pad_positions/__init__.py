"""Card for left_pad_positions: positions counted from the first column of a left-padded row."""

from harness.catalogue.card import MODERN, Card, Verdict

CARD = Card(
    id="left_pad_positions",
    title="Positions of a left-padded row counted from its padding",
    section="—",
    category="positions",
    claim=(
        "Not named by the tutorial; the common belief: the padding mask hides the padding, so a "
        "left-padded row gives its real tokens the same outputs as the same row unpadded."
    ),
    trap=(
        "The default positions are arange(T) in every row, padding included, instead of each "
        "row's real tokens counted from 0 ((mask.cumsum(-1) - 1).clamp(min=0)): a row with P "
        "padding tokens puts its first real token at position P."
    ),
    truth=(
        "With absolute sinusoidal positions added to the input, as GPT-2 adds its own (the full "
        "forward; B=2, T=8, 4 query heads, 2 K/V heads, seed 0, the second row left-padded by "
        "4): the padded row's real tokens are off by 0.323 in float32 (0.322 in bfloat16 and "
        "in float16, far above each dtype's rounding floor); its padding rows move too, by "
        "0.155. With "
        "rotary positions alone the same bug is invisible: rotary is relative, and shifting "
        "every real token of a row by P changes no distance. Measured so (the same pair with "
        "rotary instead of the absolute embedding): BENIGN in all three dtypes in the full "
        "forward and in decode, and in float64 over 20 seeds apart by float32 rounding only (at "
        "most 64 ulps of their size: the angle table is float32). Rotary goes wrong only where "
        "two conventions meet: a prefill with positions "
        "from the mask and decode steps from the cache length put the new token P too far; "
        "that is off by 0.0469 (float64, 20 seeds)."
    ),
    why=(
        "Batched generation pads on the left; with absolute positions every short prompt of "
        "the batch is read at the wrong positions and gives other outputs than it would alone, "
        "with no error."
    ),
    avoid=(
        "Derive positions from the mask (cumsum of the real tokens, minus one) whenever a "
        "row may be padded, keep that convention for prefill and decode alike, and test that "
        "a row's outputs do not depend on how much padding precedes it."
    ),
    expected=Verdict.SILENT,
    mask="left_padding",
    convention="key_padding",
    scenario="full",
    sources=("huggingface/transformers#18478", "unslothai/unsloth#3699"),
    **{**MODERN, "doctor": {"positions": "absolute"}},
)
