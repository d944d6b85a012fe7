"""Card for scale_precision: the tutorial's scale-precision worry, measured."""

from harness.extras import scale_table
from harness.verdicts import Verdict
from pitfalls import Card

CARD = Card(
    id="scale_precision",
    title="Python-float scale vs float32 tensor scale",
    section="§4.1",
    category="scale",
    claim=(
        "1/math.sqrt(d_k) is a Python float while 1/torch.sqrt(torch.tensor(64.)) is "
        '"0.12500000000000001"; the gap accumulates over training, so keep the scale a float32 '
        "tensor."
    ),
    trap="Dividing the scores by math.sqrt(d_k) (a Python float) instead of a float32 tensor.",
    truth=(
        "Both scales are exactly 0.125 for d_k = 64, and dividing float32 scores by either gives "
        "bit-identical scores: torch applies a Python scalar in the tensor's own precision."
    ),
    why="It does not matter: the claimed precision loss does not exist.",
    avoid="Nothing to avoid. Write `scores / math.sqrt(d_k)`, as nanoGPT does.",
    expected=Verdict.BENIGN,
    extra=scale_table,
)
