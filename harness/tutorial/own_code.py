"""The tutorial's own modules (``pitfalls/tutorial.py``, rebuilt from its description): §3.3's
example run as written, and the doctor on both classes with the (B, T, T) mask the code can take
and the (B, 1, T, T) mask its docstring documents."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from harness.catalogue import registry
from harness.doctor import FAIL, WARN, Config, diagnose
from harness.doctor.target import Sizes, build, load_object

TUTORIAL = registry.HOME / "tutorial.py"
SIZES = Sizes(64, 4)  # d_model and heads the doctor builds the modules with
MASKS = {"bqk": "(B, T, T)", "b1qk": "(B, 1, T, T)"}  # the second as its docstring documents it
CLASSES = ("ScaledDotProductAttention", "MultiHeadAttention")


def tutorial_class(name: str) -> type[nn.Module]:
    """One of the tutorial's classes, loaded from its file by path."""
    return load_object(f"{TUTORIAL}:{name}")


@dataclass(frozen=True)
class Example:
    """§3.3's example: three one-hot tokens, d_model 4, d_k 2, d_v 3, and a causal mask."""

    as_written: str  # what the example's own (1, 1, 3, 3) mask gives: the error it raises
    shapes: tuple[tuple[int, ...], tuple[int, ...]]  # output and weights with a (1, 3, 3) mask
    lower_triangular: bool  # the weights with that mask: zero above the diagonal


@functools.cache
def example() -> Example:
    torch.manual_seed(0)
    head = tutorial_class("ScaledDotProductAttention")(4, 2, 3)
    x = torch.eye(4)[:3].unsqueeze(0)  # (1, 3, 4): tokens 0, 1, 2 one-hot
    try:
        head(x, torch.tril(torch.ones(1, 1, 3, 3)))
        as_written = "runs"
    except RuntimeError as exc:
        as_written = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    with torch.no_grad():
        output, weights = head(x, torch.tril(torch.ones(1, 3, 3)))
    upper = torch.triu(weights[0], diagonal=1)
    shapes = (tuple(output.shape), tuple(weights.shape))
    return Example(as_written, shapes, bool((upper == 0).all()))


def _said(findings: list) -> str:
    """What the doctor flags, one clause per probe: its status, name and first clause."""
    flagged = [f for f in findings if f.status in (FAIL, WARN)]
    return "; ".join(f"{f.status.upper()} {f.probe}: {f.message.split(' (')[0]}" for f in flagged)


def diagnoses() -> pd.DataFrame:
    """The doctor on each class with each mask shape: its verdict and what it flags."""
    rows = []
    for name in CLASSES:
        for shape, described in MASKS.items():
            module = build(tutorial_class(name), SIZES)
            d = diagnose(module, Config(mask="keep", mask_shape=shape))
            causes = "; ".join(f"FAIL {c.said()}" for c in d.causes)
            rows.append(
                {
                    "module": f"`{name}`",
                    "mask": described,
                    "doctor": "healthy" if d.healthy else f"{d.problems} problem(s)",
                    "what it flags": causes or _said(d.findings) or "nothing",
                }
            )
    return pd.DataFrame(rows)
