"""Card for scale_precision: the tutorial's scale-precision worry, measured."""

from __future__ import annotations

import math

import pandas as pd
import torch

from harness.catalogue.card import Card, Pair, Verdict
from harness.inputs import generator

SCALE_D_KS = (3, 7, 48, 64, 80, 96)
_INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in units in the last place between two same-dtype float tensors."""
    if a.dtype == torch.float64:
        ints = a.view(torch.int64), b.view(torch.int64)
    else:
        ints = a.view(_INT_VIEW[a.dtype]).long(), b.view(_INT_VIEW[b.dtype]).long()
    return int((ints[0] - ints[1]).abs().max().item())


def scale_table(pair: Pair, device: torch.device, dtype: torch.dtype) -> pd.DataFrame:
    """The two scales, and how far scores divided by each (or times the reciprocal) differ."""
    rows = []
    for d_k in SCALE_D_KS:
        gen = generator(d_k)
        scores = (torch.randn(4, 32, 32, generator=gen) * math.sqrt(d_k)).to(device, dtype)
        tensor_scale = torch.sqrt(torch.tensor(float(d_k)))  # float32, as the tutorial's fix
        by_tensor = scores / tensor_scale
        by_float = scores / math.sqrt(d_k)
        times_reciprocal = scores * (1 / math.sqrt(d_k))
        rows.append(
            {
                "d_k": d_k,
                # In backticks, so the table shows every digit instead of parsing a number.
                "1/math.sqrt(d_k)": f"`{1 / math.sqrt(d_k)!r}`",
                "1/torch.sqrt(tensor(d_k))": f"`{(1 / tensor_scale).item()!r}`",
                "scores differing (÷ float vs ÷ tensor)": int((by_float != by_tensor).sum()),
                "max ulp (÷ float vs ÷ tensor)": ulp_distance(by_float, by_tensor),
                "max ulp (× 1/float vs ÷ tensor)": ulp_distance(times_reciprocal, by_tensor),
                "softmax identical": bool(torch.equal(by_float.softmax(-1), by_tensor.softmax(-1))),
            }
        )
    table = pd.DataFrame(rows)
    table.attrs["caption"] = "The two scales, and scores (4 x 32 x 32) divided by each"
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
        "Both scales are exactly 0.125 for d_k = 64, and dividing float32 scores by either gives "
        "bit-identical scores: torch applies a Python scalar in the tensor's own precision."
    ),
    why="It does not matter: the claimed precision loss does not exist.",
    avoid="Nothing to avoid. Write `scores / math.sqrt(d_k)`, as nanoGPT does.",
    expected=Verdict.BENIGN,
    extra=scale_table,
)
