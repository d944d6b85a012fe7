"""Card for rope_low_precision: rotary angles computed in the input's low-precision dtype."""

from harness.catalogue.card import MODERN, Card, Verdict

CARD = Card(
    id="rope_low_precision",
    title="Rotary angles computed in the input's dtype",
    section="—",
    category="positions",
    claim=(
        "Not named by the tutorial; the common belief: the rotary table may be built in the "
        "model's dtype like everything else, since cos and sin lie in [-1, 1] anyway."
    ),
    trap=(
        "inv_freq, the positions and their product are computed in x's dtype "
        "(positions.to(x.dtype)) instead of float32 before cos and sin are cast to x.dtype: in "
        "half precision the positions themselves round."
    ),
    truth=(
        "Measured with positions from 100,000 on (the long scenario; 4 heads of width 8, 8 "
        "tokens). float32: the same arithmetic as fixed.py, so the same output error for both, "
        "float32 rounding (BENIGN). bfloat16: all eight positions 100,000..100,007 round to "
        "99,840 (bfloat16's spacing is 512 there) and the angles round as coarsely, so the "
        "output error against the float64 module is 0.0966 where fixed.py's bfloat16 error, its "
        "rounding, stays under 0.02, and the attention logits are off by up to 0.878 where the "
        "largest is 1.29 (fixed.py: under 0.02); the error equals fixed.py's at offset 0 and is "
        "0.0966 already from "
        "offset 1,000 on. float16: 100,000 is past the largest float16 (65,504), so the "
        "positions become inf, cos and sin NaN and every output NaN. Combined: NUMERIC. "
        "CATALOGUE.md's 'logits off by ~20' is not this module's scale: its logits stay "
        "within 1.3."
    ),
    why=(
        "Long contexts in bfloat16 (training or inference): neighbouring tokens share one "
        "rotation (bfloat16 cannot tell 256 from 257), so word order is lost at long range with "
        "no error; float16 fails visibly only past 65,504 positions."
    ),
    avoid=(
        "Build inv_freq, the positions and the angles in float32 (Hugging Face keeps inv_freq "
        "a float32 buffer and turns autocast off there) and cast only cos and sin to x.dtype; "
        "test a bfloat16 module at a large position offset against a float64 one."
    ),
    expected=Verdict.NUMERIC,
    mask="causal",
    convention="internal",
    scenario="long",
    sources=("EleutherAI/gpt-neox#1003", "huggingface/transformers PR 29285"),
    **MODERN,
)
