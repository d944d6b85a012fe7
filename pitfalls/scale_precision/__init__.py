"""Card for scale_precision: the tutorial's scale-precision worry, measured."""

from __future__ import annotations

import math

import pandas as pd
import torch
from torch import Tensor

from harness.catalogue.card import Card, Pair, Verdict
from harness.inputs import generator

SCALE_D_KS = (3, 7, 48, 64, 80, 96)  # the tutorial's 64 and common head widths
SWEEP_D_KS = range(1, 1025)
SCORES = (32, 32)  # the scores drawn for each d_k
_INT_VIEW = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
}


def ulps(a: Tensor, b: Tensor) -> Tensor:
    """Elementwise distance in units in the last place between same-dtype, same-sign floats."""
    ints = a.view(_INT_VIEW[a.dtype]), b.view(_INT_VIEW[b.dtype])
    if ((ints[0] ^ ints[1]) < 0).any():  # a sign differs: widen so the difference cannot wrap
        ints = ints[0].long(), ints[1].long()
    return (ints[0] - ints[1]).abs()


def ulp_distance(a: Tensor, b: Tensor) -> int:
    """Largest distance in units in the last place between two same-dtype float tensors."""
    return int(ulps(a, b).max().item())


def tensor_scale(d_k: int) -> Tensor:
    """The tutorial's fix, as fixed.py computes it: a float32 tensor sqrt(d_k)."""
    return torch.sqrt(torch.tensor(float(d_k)))


def sweep_scores() -> Tensor:
    """Float32 scores for every d_k of the sweep, (len, 32, 32), spread like unscaled Q K^T."""
    base = torch.randn(len(SWEEP_D_KS), *SCORES, generator=generator(0))
    return base * torch.tensor([math.sqrt(d_k) for d_k in SWEEP_D_KS]).view(-1, 1, 1)


def sqrt_sweep(scores: Tensor | None = None) -> pd.DataFrame:
    """Per d_k in 1..1024, on the CPU in float32: the two roots, and the scores divided by each.

    All d_k at once: on the CPU a Python float divides in the tensor's precision, so
    ``÷ math.sqrt(d_k)`` is taken as ``÷ float32(math.sqrt(d_k))`` (the tests check that the two
    agree for every d_k).
    """
    scores = sweep_scores() if scores is None else scores
    as_float = torch.tensor([math.sqrt(d_k) for d_k in SWEEP_D_KS], dtype=torch.float32)
    reciprocal = torch.tensor([1 / math.sqrt(d_k) for d_k in SWEEP_D_KS], dtype=torch.float32)
    as_tensor = torch.stack([tensor_scale(d_k) for d_k in SWEEP_D_KS])
    by_tensor = scores / as_tensor.view(-1, 1, 1)
    by_float = scores / as_float.view(-1, 1, 1)
    times_reciprocal = scores * reciprocal.view(-1, 1, 1)
    return pd.DataFrame(
        {
            "d_k": list(SWEEP_D_KS),
            "scale ulp": ulps(as_float, as_tensor).tolist(),
            "max ulp (÷ float vs ÷ tensor)": ulps(by_float, by_tensor).flatten(1).amax(1).tolist(),
            "max ulp (× 1/float vs ÷ tensor)": (
                ulps(times_reciprocal, by_tensor).flatten(1).amax(1).tolist()
            ),
            "softmax differs": (
                (by_float.softmax(-1) != by_tensor.softmax(-1)).flatten(1).any(1).tolist()
            ),
        }
    )


def _one_d_k(d_k: int, scores: Tensor) -> dict[str, object]:
    """One d_k, divided by the Python float itself, as buggy.py does."""
    as_tensor = tensor_scale(d_k)
    by_tensor = scores / as_tensor
    by_float = scores / math.sqrt(d_k)
    times_reciprocal = scores * (1 / math.sqrt(d_k))
    scale_ulp = ulp_distance(torch.tensor(math.sqrt(d_k), dtype=torch.float32), as_tensor)
    return {
        "d_k": str(d_k),
        # In backticks, so the table shows every digit instead of parsing a number.
        "1/math.sqrt(d_k)": f"`{1 / math.sqrt(d_k)!r}`",
        "1/torch.sqrt(tensor(d_k))": f"`{(1 / as_tensor).item()!r}`",
        "scale ulp": scale_ulp,
        "d_k with scales apart": int(scale_ulp > 0),
        "d_k with scores apart": int(not torch.equal(by_float, by_tensor)),
        "max ulp (÷ float vs ÷ tensor)": ulp_distance(by_float, by_tensor),
        "max ulp (× 1/float vs ÷ tensor)": ulp_distance(times_reciprocal, by_tensor),
        "d_k with softmax apart": int(not torch.equal(by_float.softmax(-1), by_tensor.softmax(-1))),
    }


# What the sweep's row states, as bounds: the largest ulp between the two roots and between the
# scores divided by each. Which d_k differ, and how many, depends on the CPU's sqrt kernel.
ROOT_ULPS = 1
SCORE_ULPS = 2


def at_most(value: int, bound: int) -> str:
    """A sweep maximum as the bound it keeps (``≤ 1``), or the value itself when it does not."""
    return f"≤ {bound}" if value <= bound else str(value)


def scale_table(pair: Pair, device: torch.device, dtype: torch.dtype) -> pd.DataFrame:
    """The two scales and the scores divided by each: a few widths, then the bounds that hold
    over 1..1024 on the CPU."""
    scores = sweep_scores()
    rows = [_one_d_k(d_k, scores[SWEEP_D_KS.index(d_k)].to(device, dtype)) for d_k in SCALE_D_KS]
    sweep = sqrt_sweep(scores)
    rows.append(
        {
            "d_k": f"{SWEEP_D_KS[0]}..{SWEEP_D_KS[-1]}",
            "1/math.sqrt(d_k)": "",
            "1/torch.sqrt(tensor(d_k))": "",
            "scale ulp": at_most(int(sweep["scale ulp"].max()), ROOT_ULPS),
            "d_k with scales apart": "",
            "d_k with scores apart": "",
            "max ulp (÷ float vs ÷ tensor)": at_most(
                int(sweep["max ulp (÷ float vs ÷ tensor)"].max()), SCORE_ULPS
            ),
            "max ulp (× 1/float vs ÷ tensor)": at_most(
                int(sweep["max ulp (× 1/float vs ÷ tensor)"].max()), SCORE_ULPS
            ),
            "d_k with softmax apart": "",
        }
    )
    table = pd.DataFrame(rows)  # no plot: a scatter of 1- and 2-ulp points reads as a gap
    table.attrs["caption"] = (
        "The two scales, and scores (32 x 32 per d_k) divided by each: a few widths (1 where "
        "they differ), then the largest ulp over all d_k in 1..1024 on the CPU, as the bound it "
        "keeps (which d_k differ depends on the CPU's sqrt kernel)"
    )
    return table


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
        "Both scales are exactly 0.125 for d_k = 64, and torch applies a Python scalar in the "
        "tensor's own precision, so the scores differ only where the two float32 roots do; "
        "there the tensor is the less exact one. torch's float32 sqrt is at most 1 ulp off the "
        "correctly rounded root, for some d_k of 1..1024 (for none of the table's first widths); "
        "which ones, and how many, depends on the CPU's sqrt kernel (the same torch build "
        "differs from machine to machine). math.sqrt rounded to float32 is never off. For those "
        "d_k the divided scores "
        "are at most 2 ulp apart on the CPU, elsewhere bit-identical. The pair is BENIGN at the "
        "d_k of the tables below, and at the first d_k whose roots differ on the CPU that runs "
        "this trap's own test."
    ),
    why="It does not matter: the claimed precision loss does not exist.",
    avoid="Nothing to avoid. Write `scores / math.sqrt(d_k)`, as nanoGPT does.",
    expected=Verdict.BENIGN,
    extra=scale_table,
)
