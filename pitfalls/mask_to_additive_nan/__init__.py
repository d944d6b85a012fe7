"""Card for mask_to_additive_nan: a 0/1 keep mask turned into an additive one by multiplying."""

from harness.catalogue.card import MODERN, Card, Verdict

CARD = Card(
    id="mask_to_additive_nan",
    title="An additive mask built as (1 - keep) * -inf",
    section="—",
    category="masks",
    claim=(
        "Not named by the tutorial; the common belief: (1 - keep) * -inf turns a 0/1 keep mask "
        "into the additive 0 / -inf mask, as (1 - keep) * -10000 does."
    ),
    trap=(
        "The additive mask is built by multiplying: where keep is 1 the product is 0 * -inf, "
        "which IEEE 754 defines as NaN, not 0."
    ),
    truth=(
        "Every allowed cell of the additive mask is NaN (the blocked ones are -inf), so every "
        "row of scores holds a NaN: all 64 attention rows and every output are NaN, in float32 "
        "as in bfloat16 and float16, on ordinary inputs. The harness calls it SILENT, not "
        "NUMERIC: NUMERIC is for a bug float32 survives, and this one raises nothing in any "
        "dtype. It stays silent only until training: the loss of the first step is NaN, and so "
        "is every entry of every gradient. Aside, on the usual alternative: two finfo.min masks "
        "added together give -inf in float16, bfloat16 and float32 alike (the catalogue says in "
        "half precision; measured in all three)."
    ),
    why=(
        "Nothing raises: inference hands NaN on to the sampler, training stops at a NaN loss in "
        "its first step, and the hunt for the NaN starts far from the one line that made it."
    ),
    avoid=(
        "Select, never multiply: zeros_like(keep).masked_fill(keep == 0, -inf), or finfo.min "
        "(which keeps an all-padding row finite), combining masks as booleans rather than adding"
        " finfo.min planes; assert the additive mask is finite wherever keep is 1."
    ),
    expected=Verdict.SILENT,
    mask="both",
    convention="keep_float",
    sources=(
        "onnx/onnx PR 8068",
        "huggingface/transformers PR 27114",
        "NVIDIA-NeMo/Automodel PR 2658",
    ),
    **MODERN,
)
