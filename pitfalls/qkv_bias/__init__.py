"""Card for qkv_bias: biases on the Q, K, V projections."""

from __future__ import annotations

import pandas as pd
import torch

from harness.catalogue.card import Card, Pair, Verdict
from harness.inputs import upstream_gradient
from harness.runner import as_dtype, exact_float32, run, seeded


def key_bias_table(pair: Pair, device: torch.device, dtype: torch.dtype) -> pd.DataFrame:
    """With all three biases random: each bias's gradient, and the effect of zeroing it."""
    card = pair.card
    shape = card.shape
    with seeded(0):
        module = card.build(pair.buggy, shape).eval()  # every bias at nn.Linear's random init
    inputs = card.inputs(shape, 0)
    x = inputs.x.to(device, dtype)
    with exact_float32(device):
        base = run(as_dtype(module, device, dtype), x, None, lambda s: upstream_gradient(s, 0))
        rows = []
        for name in ("W_q", "W_k", "W_v"):
            ablated = as_dtype(module, device, dtype)
            getattr(ablated, name).bias.data.zero_()
            out = run(ablated, x, None, None).output
            rows.append(
                {
                    "bias": f"{name}.bias",
                    "grad norm": base.grads[f"{name}.bias"].norm().item(),
                    "weight grad norm": base.grads[f"{name}.weight"].norm().item(),
                    "max |output change| when zeroed": (out - base.output).abs().max().item(),
                }
            )
    table = pd.DataFrame(rows)
    table.attrs["caption"] = "Every bias at nn.Linear's random init, each zeroed in turn"
    table.attrs["plots"] = [
        dict(
            kind="bars",
            x="bias",
            y="grad norm",
            logy=True,
            title="qkv_bias: each bias's gradient; the key bias's is rounding noise",
            ylabel="gradient norm (log scale)",
        )
    ]
    return table


def to_buggy(state, shape):
    """The fixed weights plus biases: b_q = b_v = 0 (as BERT and GPT-2 start), b_k random.

    A random key bias shows the point: it shifts every score of a query by the same q . b_k,
    which softmax ignores.
    """
    gen = torch.Generator().manual_seed(0)
    d_k, d_v = state["W_k.weight"].shape[0], state["W_v.weight"].shape[0]
    dtype = state["W_k.weight"].dtype
    return {
        **state,
        "W_q.bias": torch.zeros(d_k, dtype=dtype),
        "W_k.bias": torch.randn(d_k, generator=gen).to(dtype),
        "W_v.bias": torch.zeros(d_v, dtype=dtype),
    }


CARD = Card(
    id="qkv_bias",
    title="Biases on the Q, K, V projections",
    section="§3.2",
    category="initialisation",
    claim="bias=False is mandatory: a bias breaks attention's symmetry and stability.",
    trap="nn.Linear(..., bias=True) for W_q, W_k and W_v.",
    truth=(
        "Softmax is invariant to adding a constant to a query's scores, so the key bias changes "
        "nothing and gets exactly zero gradient in exact arithmetic: dead weight, not instability. "
        "Query and value biases are ordinary parameters (BERT and GPT-2 use them). The "
        "comparison gives buggy.py fixed.py's weights plus a random key bias and zero query and "
        "value biases (as BERT and GPT-2 start), so what it measures is the key bias alone; the "
        "table after it gives all three biases random."
    ),
    why="Harmless: at worst d_k wasted parameters in every attention layer.",
    avoid="Drop the key bias if you like; keep or drop the others by taste.",
    expected=Verdict.BENIGN,
    to_buggy=to_buggy,
    extra=key_bias_table,
)
