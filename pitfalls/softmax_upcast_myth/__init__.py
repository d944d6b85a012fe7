"""Card for softmax_upcast_myth: must softmax be upcast to float32? Measured on many rows."""

from collections.abc import Iterator

import pandas as pd
import torch
from torch import Tensor

from harness.catalogue.card import MODERN, Card, Pair, Verdict
from harness.devices import dtype_name
from harness.inputs import generator

LENGTHS = (8, 64, 1024)  # keys per row, multiples of 8
ODD_LENGTHS = (19, 31, 63, 127, 4095)  # keys per row, not multiples of 8
SPREADS = (1.0, 4.0, 16.0)  # standard deviation of the logits
ROWS = 256  # rows drawn per (length, spread)
EQUAL = 4096  # keys of the all-equal row where an accumulator in the dtype saturates
HALVES = (torch.float16, torch.bfloat16)


def score_draws() -> Iterator[tuple[int, float, Tensor]]:
    """(keys, spread, (ROWS, keys) float64 logits) for every length and spread, then EQUAL
    equal logits (spread 0), seeded."""
    gen = generator(0)
    for n in LENGTHS + ODD_LENGTHS:
        for spread in SPREADS:
            yield n, spread, torch.randn(ROWS, n, generator=gen, dtype=torch.float64) * spread
    yield EQUAL, 0.0, torch.zeros(ROWS, EQUAL, dtype=torch.float64)


def narrow_softmax(scores: Tensor) -> Tensor:
    """Softmax as a kernel that accumulates in the input dtype computes it: the row max is
    subtracted, but the sum of exp is taken one key at a time, rounded to the dtype at each."""
    exp = (scores - scores.amax(dim=-1, keepdim=True)).exp()
    total = torch.zeros_like(exp[..., 0])  # (rows,)
    for j in range(exp.size(-1)):
        total = total + exp[..., j]
    return exp / total[..., None]


def ulps_apart(a: Tensor, b: Tensor) -> Tensor:
    """How many representable values lie between two tensors of non-negative float16 or
    bfloat16 numbers, element by element."""
    return (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()


def softmax_errors(scores: Tensor, device: torch.device, dtype: torch.dtype) -> dict[str, object]:
    """F.softmax in ``dtype`` against the float32-upcast one and the float64 softmax of the same
    (rounded) logits."""
    s = scores.to(device, dtype)
    ref = s.double().softmax(dim=-1)
    own = s.softmax(dim=-1)
    upcast = s.softmax(dim=-1, dtype=torch.float32).to(dtype)
    return {
        "max error, in dtype": (own.double() - ref).abs().max().item(),
        "max error, upcast": (upcast.double() - ref).abs().max().item(),
        "bit-identical": torch.equal(own, upcast),
        "fraction off the upcast": (own != upcast).double().mean().item(),
        "most ulps apart": ulps_apart(own, upcast).max().item(),
        "max |row sum - 1|, in dtype": (own.double().sum(-1) - 1).abs().max().item(),
    }


def narrow_row_sum_error(scores: Tensor, device: torch.device, dtype: torch.dtype) -> float:
    """Max |row sum - 1| of ``narrow_softmax`` on ``scores`` in ``dtype``."""
    narrow = narrow_softmax(scores.to(device, dtype))
    return (narrow.double().sum(-1) - 1).abs().max().item()


def odd_lengths_row(half: torch.dtype, device: torch.device) -> dict[str, object]:
    """The rows whose length is no multiple of 8, as the bounds that hold: which probabilities
    differ from the upcast ones there, and how many, depends on the CPU's kernels."""
    found = [softmax_errors(s, device, half) for n, _, s in score_draws() if n in ODD_LENGTHS]
    fraction = max(f["fraction off the upcast"] for f in found)
    ulps = max(f["most ulps apart"] for f in found)
    return {
        "dtype": dtype_name(half),
        "keys": ", ".join(map(str, ODD_LENGTHS)),
        "logit spread": ", ".join(f"{s:g}" for s in SPREADS),
        "bit-identical": "up to the CPU",
        "fraction off the upcast": "< 0.001" if fraction < 1e-3 else f"{fraction:.3g}",
        "most ulps apart": "≤ 1" if ulps <= 1 else str(ulps),
    }


def upcast_table(pair: Pair, device: torch.device, dtype: torch.dtype) -> pd.DataFrame:
    """Softmax in float16 and bfloat16 vs upcast, per row length and logit spread (whatever
    ``dtype`` the report asks for: in float32 the upcast is no change at all); the lengths that
    are no multiple of 8 as one row of bounds per dtype."""
    rows = []
    for half in HALVES:
        rows += [
            {
                "dtype": dtype_name(half),
                "keys": n,
                "logit spread": spread,
                **softmax_errors(scores, device, half),
                "max |row sum - 1|, dtype accumulator": narrow_row_sum_error(scores, device, half),
            }
            for n, spread, scores in score_draws()
            if n not in ODD_LENGTHS
        ]
        rows.append(odd_lengths_row(half, device))
    table = pd.DataFrame(rows).astype(object)
    table = table.where(table.notna(), "")  # the bounds row has no errors of its own
    table.attrs["caption"] = (
        f"F.softmax in the dtype vs upcast to float32, against float64, {ROWS} rows each; the "
        "last column emulates a kernel that accumulates the sum in the dtype"
    )
    return table


CARD = Card(
    id="softmax_upcast_myth",
    title="Softmax without an upcast to float32",
    section="—",
    category="numerics",
    claim=(
        "Not named by the tutorial; the common belief: in float16 or bfloat16, softmax must be "
        "upcast (F.softmax(scores, dim=-1, dtype=torch.float32)) or the probabilities lose "
        "precision."
    ),
    trap="F.softmax(scores, dim=-1) in the input dtype, without the upcast.",
    truth=(
        "On the CPU (torch 2.13) F.softmax in float16 or bfloat16 already computes in float32 "
        "and rounds once at the end: over 256 rows each of 8, 64 and 1024 keys with logit "
        "spreads 1, 4 and 16 its probabilities are bit-identical to the upcast ones; at 19, 31, "
        "63, 127 and 4095 keys fewer than one in a thousand differ from them, by one unit in "
        "the last place. buggy.py's and fixed.py's weights and outputs on the card's draw are "
        "bit-identical (BENIGN in every dtype). Either way the probabilities are off the "
        "float64 softmax by at most half a unit in the last place of a probability near 1 "
        "(2.44e-4 in float16 and 1.95e-3 in bfloat16), and rows sum to 1 within the unit "
        "roundoff (4.88e-4 and 3.91e-3; the catalogue's 1.3e-4, 3.0e-3 and 4e-4 "
        "are of the same order). The belief holds for kernels that accumulate in the input "
        "dtype: emulated here, 4096 equal logits sum to 2.0 in float16 and 16.0 in bfloat16 "
        "instead of 1."
    ),
    why=(
        "Harmless in torch eager: the upcast costs a float32 copy of the weights and buys "
        "nothing. It matters in a hand-written or third-party kernel whose sum runs in the "
        "input dtype."
    ),
    avoid=(
        "Nothing to avoid in torch eager. In a custom kernel accumulate the max and the sum in "
        "float32 (and test a long row of equal logits in float16 and bfloat16)."
    ),
    expected=Verdict.BENIGN,
    mask="causal",
    convention="internal",
    extra=upcast_table,
    sources=("huggingface/candle#3727", "ml-explore/mlx PR 953"),
    **MODERN,
)
