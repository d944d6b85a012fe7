"""Which position and head each output came from: the picture of the traps that split or merge
heads wrongly.

With W_q = W_k = SHARP x I, W_v = W_o = I and inputs whose every head slice is a unit vector, a
correct module's heads each attend to their own position alone (a unit vector's dot product is
largest with itself, and SHARP^2 makes the softmax one-hot there), so its output at (position t,
head h) is its input at (t, h). A module that splits or merges heads wrongly sends each output
block somewhere else. The Jacobian of the output's (position, head) blocks with respect to the
input's shows where: one bright cell per row, on the diagonal when the layout is right.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from harness.catalogue.card import Pair
from harness.inputs import generator
from harness.runner import split_output

SHARP = 32.0  # W_q and W_k: scores of SHARP^2 x (a dot product of unit vectors)


def unit_head_inputs(tokens: int, heads: int, width: int, seed: int = 0) -> Tensor:
    """(1, tokens, heads * width) inputs whose every head slice is a seeded unit vector."""
    x = torch.randn(1, tokens, heads, width, generator=generator(seed), dtype=torch.float64)
    return (x / x.norm(dim=-1, keepdim=True)).reshape(1, tokens, heads * width)


def source_map(module: nn.Module, tokens: int, heads: int) -> np.ndarray:
    """(tokens * heads, tokens * heads): row t * heads + h is output (position t, head h), column
    s * heads + g input (s, g); each cell the norm of that block of the Jacobian, in float64."""
    module = module.double()
    d_model = module.W_q.in_features
    eye = torch.eye(d_model, dtype=torch.float64)
    with torch.no_grad():
        for name, scale in (("W_q", SHARP), ("W_k", SHARP), ("W_v", 1.0), ("W_o", 1.0)):
            getattr(module, name).weight.copy_(scale * eye)
    x = unit_head_inputs(tokens, heads, d_model // heads)
    jac = torch.autograd.functional.jacobian(lambda x: split_output(module(x))[0], x)
    width = d_model // heads
    blocks = jac.reshape(tokens, heads, width, tokens, heads, width)  # out (t, h, .), in (s, g, .)
    norms = blocks.pow(2).sum(dim=(2, 5)).sqrt()  # (T, h, T, h)
    return norms.reshape(tokens * heads, tokens * heads).numpy()


def came_from(sources: np.ndarray, heads: int) -> list[str]:
    """For each output (position, head), the input block it depends on most: ``"s, g"``."""
    return [f"{j // heads}, {j % heads}" for j in sources.argmax(axis=1)]


def source_table(pair: Pair, device: torch.device, dtype: torch.dtype) -> pd.DataFrame:
    """Where each output (position, head) of fixed.py and buggy.py came from, with the maps
    drawn beside the trap (on the CPU in float64, whatever the report's device and dtype)."""
    card, shape = pair.card, pair.card.shape
    maps = {
        name: source_map(card.build(module, shape), shape.seq_len, shape.heads)
        for name, module in (("fixed.py", pair.fixed), ("buggy.py", pair.buggy))
    }
    rows = [f"{t}, {h}" for t in range(shape.seq_len) for h in range(shape.heads)]
    table = pd.DataFrame({"output (position, head)": rows})
    for name, sources in maps.items():
        table[f"came from ({name})"] = came_from(sources, shape.heads)
    table["moved"] = table["came from (buggy.py)"] != table["output (position, head)"]
    table.attrs["caption"] = (
        "Which input (position, head) each output (position, head) depends on most, with "
        f"W_q = W_k = {SHARP:g} I, W_v = W_o = I and unit-vector head slices, so that each head "
        "of a correct module attends to its own position only"
    )
    top = max(float(m.max()) for m in maps.values())
    table.attrs["plots"] = [
        dict(
            kind="maps",
            title=(
                f"{card.id}: where each output came from (row t*{shape.heads} + h: output at "
                f"position t, head h;\ncolumn: input at position s, head g; "
                "a correct layout is the diagonal)"
            ),
            maps=maps,
            label="|d output block / d input block|",
            vmax=top,
            xlabel="input (position, head)",
            ylabel="output (position, head)",
        )
    ]
    return table
