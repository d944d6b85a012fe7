"""Card for head_loop: multi-head attention as a loop over single heads."""

from __future__ import annotations

import time

import pandas as pd
import torch
from torch import nn

from harness.catalogue.card import Card, Pair, Verdict, multi_head
from harness.inputs import make_inputs
from harness.runner import as_dtype, seeded
from harness.shapes import Shape


def _best_ms(module: nn.Module, x: torch.Tensor, repeats: int) -> float:
    """The fastest of ``repeats`` forward + backward passes, in ms: what other load on the
    machine adds to a pass is never less than zero, so the fastest is the least disturbed."""
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
    return 1000 * min(times)


TIMING_SHAPES = tuple(  # (batch, seq_len, d_model, heads): few wide heads to many narrow ones,
    (4, 32, 128, heads)
    for heads in (2, 4, 8, 16, 32)  # where per-head overhead dominates
)


def timing_table(
    pair: Pair, device: torch.device, dtype: torch.dtype, repeats: int = 15
) -> pd.DataFrame:
    """Forward + backward wall time of buggy and fixed (the fastest of ``repeats``), wide to
    narrow heads."""
    rows = []
    for batch, seq_len, d_model, heads in TIMING_SHAPES:
        d_k = d_model // heads
        shape = Shape(batch=batch, seq_len=seq_len, d_model=d_model, d_k=d_k, d_v=d_k, heads=heads)
        x = make_inputs(shape, 0).x.to(device, dtype)
        ms = {}
        for name, module in (("fixed", pair.fixed), ("buggy", pair.buggy)):
            with seeded(0):
                built = as_dtype(pair.card.build(module, shape), device, dtype)
            _best_ms(built, x, 2)  # warm-up
            ms[name] = _best_ms(built, x, repeats)
        rows.append(
            {
                "heads": heads,
                "shape": shape.label(),
                "fixed ms": ms["fixed"],
                "buggy ms": ms["buggy"],
                "buggy / fixed": ms["buggy"] / ms["fixed"],
            }
        )
    table = pd.DataFrame(rows)
    table.attrs["timing"] = True
    table.attrs["plots"] = [
        dict(
            x="heads",
            y=["buggy / fixed"],
            logx=True,
            title="head_loop: the loop's time over the fused module's (forward + backward)",
            ylabel="buggy / fixed wall-clock time",
        )
    ]
    return table


PROJECTIONS = ("W_q", "W_k", "W_v")


def to_buggy(state, shape):
    """Split each fused (h * d_k, d_model) projection into h row blocks, one per head."""
    out = {k: v for k, v in state.items() if not k.startswith(PROJECTIONS)}
    for name in PROJECTIONS:
        for i, block in enumerate(state[f"{name}.weight"].chunk(shape.heads, dim=0)):
            out[f"{name}.{i}.weight"] = block.clone()  # (d_k, d_model)
    return out


def to_fixed(grads, shape):
    """Stack per-head gradients back into the fused layout: the inverse of to_buggy."""
    out = {k: v for k, v in grads.items() if not k.startswith(PROJECTIONS)}
    for name in PROJECTIONS:
        blocks = [grads[f"{name}.{i}.weight"] for i in range(shape.heads)]
        out[f"{name}.weight"] = torch.cat(blocks, dim=0)  # (h * d_k, d_model)
    return out


CARD = Card(
    id="head_loop",
    title="Multi-head attention as a ModuleList of single heads",
    section="§5.2",
    category="performance",
    claim="Multi-head attention is a ModuleList of single-head modules, concatenated.",
    trap="h separate small projections and attention calls instead of one fused, batched call.",
    truth=(
        "Numerically the same function as the fused form (within the noise floor). Its cost is "
        "h small matmuls and attention calls instead of one each, so the loop falls further "
        "behind the more and narrower the heads: the timing table goes from 2 heads of width 64 "
        "to 32 heads of width 4, where the loop is the slower of the two. Its numbers are in "
        "timings.md, which each report run writes beside report.md (one run's, not committed: "
        "wall-clock time varies by machine)."
    ),
    why="Only speed, and only when heads are many and narrow: worth knowing, not worth fearing.",
    avoid=(
        "Fuse the projections and split heads with unflatten(-1, (h, d_k)).transpose(1, 2) "
        "(the same as view(B, T, h, d_k).transpose(1, 2)); see the time ratio in timings.md."
    ),
    expected=Verdict.BENIGN,
    build=multi_head,
    has_heads=True,
    mask="causal",
    shape=Shape(batch=2, seq_len=5, d_model=16, d_k=4, d_v=4, heads=4),
    to_buggy=to_buggy,
    to_fixed=to_fixed,
    extra=timing_table,
)
