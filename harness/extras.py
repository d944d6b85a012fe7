"""Trap-specific numbers for the report: each function takes (pair, device, dtype) -> table.

They answer a card's own question (is the scale really imprecise? how slow is the head loop?)
with a measurement; tables flagged ``attrs["timing"]`` hold wall-clock numbers, which differ
from run to run and are kept out of deterministic text.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import pandas as pd
import torch
from torch import nn

from harness.inputs import generator, make_inputs, upstream_gradient
from harness.runner import as_dtype, exact_float32, run, seeded
from harness.seeds import N_SEEDS, degenerate, seed_stats

if TYPE_CHECKING:
    from pitfalls import Pair

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


def _default_init(pair: Pair):
    """Build the fixed module, then put every nn.Linear back to its own default init."""

    def build(shape):
        module = pair.card.build(pair.fixed, shape)
        for layer in module.modules():
            if isinstance(layer, nn.Linear):
                layer.reset_parameters()
        return module

    return build


def init_table(pair: Pair, device: torch.device, dtype: torch.dtype) -> pd.DataFrame:
    """Fixed (xavier), buggy (normal std 1) and nn.Linear's default init, over seeds."""
    card = pair.card
    shape = card.shape
    fan_in, fan_out = shape.d_model, shape.d_k
    variants = {
        "xavier_uniform_ (fixed.py)": (lambda s: card.build(pair.fixed, s), 2 / (fan_in + fan_out)),
        "normal_(std=1) (buggy.py)": (lambda s: card.build(pair.buggy, s), 1.0),
        "nn.Linear default": (_default_init(pair), 1 / (3 * fan_in)),
    }
    rows = []
    for name, (builder, variance) in variants.items():
        stats = seed_stats(pair, builder, device, dtype, shape, range(N_SEEDS))
        att, norms, err = stats.attention, stats.grad_norms, stats.error
        with seeded(0):
            measured = builder(shape).W_q.weight.var().item()
        rows.append(
            {
                "init": name,
                "weight variance (theory)": variance,
                "weight variance (measured)": measured,
                "entropy (mean)": att.get("entropy_mean", float("nan")),
                "saturated rows": att.get("saturated", float("nan")),
                "grad norm W_q": norms.get("W_q.weight", float("nan")),
                "grad norm W_v": norms.get("W_v.weight", float("nan")),
                "degenerate": degenerate(att) if att else None,
                "error": err or "",
            }
        )
    table = pd.DataFrame(rows)
    table.attrs["caption"] = f"Three inits over {N_SEEDS} seeds"
    return table


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
    return table


def _median_ms(module: nn.Module, x: torch.Tensor, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        if x.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out, _ = module(x)
        out.sum().backward()
        if x.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1000 * sorted(times)[len(times) // 2]


TIMING_SHAPES = (
    (8, 128, 256, 8),  # (batch, seq_len, d_model, heads): few wide heads
    (8, 64, 256, 16),
    (4, 32, 128, 16),  # many narrow heads: per-head overhead dominates
)


def timing_table(
    pair: Pair, device: torch.device, dtype: torch.dtype, repeats: int = 15
) -> pd.DataFrame:
    """Forward + backward wall time of buggy and fixed (median of runs), wide to narrow heads."""
    from harness.shapes import Shape

    rows = []
    for batch, seq_len, d_model, heads in TIMING_SHAPES:
        d_k = d_model // heads
        shape = Shape(batch=batch, seq_len=seq_len, d_model=d_model, d_k=d_k, d_v=d_k, heads=heads)
        x = make_inputs(shape, 0).x.to(device, dtype)
        ms = {}
        for name, module in (("fixed", pair.fixed), ("buggy", pair.buggy)):
            with seeded(0):
                built = as_dtype(pair.card.build(module, shape), device, dtype)
            _median_ms(built, x, 2)  # warm-up
            ms[name] = _median_ms(built, x, repeats)
        rows.append(
            {
                "shape": shape.label(),
                "fixed ms": ms["fixed"],
                "buggy ms": ms["buggy"],
                "buggy / fixed": ms["buggy"] / ms["fixed"],
            }
        )
    table = pd.DataFrame(rows)
    table.attrs["timing"] = True
    return table


SWEEP_D_KS = (8, 16, 32, 64, 128, 256)


def scale_sweep(pair: Pair, device: torch.device, dtype: torch.dtype) -> pd.DataFrame:
    """Attention entropy and W_q gradient norm of fixed and buggy as d_k grows, over 4 seeds."""
    from harness.shapes import Shape

    card = pair.card
    rows = []
    for d_k in SWEEP_D_KS:
        shape = Shape(batch=4, seq_len=16, d_model=64, d_k=d_k, d_v=16)
        row: dict[str, float] = {"d_k": d_k}
        for name, module in (("fixed", pair.fixed), ("buggy", pair.buggy)):
            stats = seed_stats(pair, lambda s, m=module: card.build(m, s), device, dtype, shape,
                               range(4))  # fmt: skip
            row[f"entropy ({name})"] = stats.attention["entropy_mean"]
            row[f"saturated rows ({name})"] = stats.attention["saturated"]
            row[f"grad norm W_q ({name})"] = stats.grad_norms["W_q.weight"]
        rows.append(row)
    table = pd.DataFrame(rows)
    table.attrs["caption"] = "Sweep over d_k (d_model 64, seq_len 16, 4 seeds)"
    table.attrs["plots"] = [
        dict(x="d_k", y=["entropy (fixed)", "entropy (buggy)"], logx=True,
             title="missing_scale: attention entropy as d_k grows", ylabel="normalized entropy"),
        dict(x="d_k", y=["grad norm W_q (fixed)", "grad norm W_q (buggy)"], logx=True,
             title="missing_scale: W_q gradient norm as d_k grows", ylabel="gradient norm"),
    ]  # fmt: skip
    return table
