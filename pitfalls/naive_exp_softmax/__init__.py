"""Card for naive_exp_softmax: a hand-written softmax without the row max."""

from harness.catalogue.card import MODERN, Card, Verdict

# Standard deviation of x on the edge inputs: logits then reach 32, past float16's exp limit
# (11.09) and far below float32's and bfloat16's (88.7). Ordinary inputs (std 1) reach 1.3.
INPUT_SCALE = 5.0

CARD = Card(
    id="naive_exp_softmax",
    title="A hand-written softmax without the row max",
    section="—",
    category="numerics",
    claim=(
        "Not named by the tutorial; the common belief: softmax is exp(s) / sum(exp(s)), and "
        "subtracting the row max is an optional refinement."
    ),
    trap=(
        "A softmax written out as exp(s) / exp(s).sum(-1) in the input dtype, without "
        "subtracting each row's max first."
    ),
    truth=(
        "Subtracting the max changes nothing mathematically, so ordinary inputs (logits up to "
        "1.29) are within the floor in every dtype. With x of standard deviation 5 the logits "
        "reach 32.3 (lowest -23.5): float16's exp overflows past 11.09 (65504 = e^11.09), and "
        "inf / inf is NaN, in exactly the 18 of 64 attention rows whose max passes 11.09; W_o "
        "spreads them to 10 of the 16 output positions. float32 and bfloat16 overflow only past "
        "88.7 and stay within the floor: NUMERIC."
    ),
    why=(
        "Mixed-precision training or a float16 export turns NaN at the first large activation, "
        "long after the float32 tests passed."
    ),
    avoid=(
        "Use F.softmax (it subtracts the max); a hand-written or exported softmax must compute "
        "exp(s - max(s)), and be tested in float16 with logits past 11."
    ),
    expected=Verdict.NUMERIC,
    mask="causal",
    convention="internal",
    edge="large",
    input_scale=INPUT_SCALE,
    sources=("pytorch/executorch PR 18407", "uTensor/uTensor#175"),
    **MODERN,
)
