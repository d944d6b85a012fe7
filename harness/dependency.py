"""Black-box probes on one module: what it depends on, and whether it repeats itself.

Karpathy's gradient-dependency check ("A Recipe for Training Neural Networks", 2019): make the
loss depend on one output position only, backpropagate, and see which inputs get a gradient.
For a causal module, the loss at position t must give exactly zero gradient to inputs after t.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from harness.runner import seeded, split_output


@dataclass(frozen=True)
class Leak:
    """The strongest dependency of an output position on a later input position."""

    query: int  # output position t
    key: int  # input position s > t
    grad_norm: float  # norm of d out[:, t] / d x[:, s]

    def __str__(self) -> str:
        if math.isnan(self.grad_norm):
            return f"output at position {self.query} gets a NaN gradient from input {self.key}"
        return (
            f"output at position {self.query} depends on input {self.key}: "
            f"gradient norm {self.grad_norm:.3g}"
        )


def future_leak(module: nn.Module, x: Tensor, mask: Tensor | None) -> Leak | None:
    """The worst dependency of position t's output on inputs after t, or None if there is none.

    ``module`` is called as ``module(x)`` or ``module(x, mask)``; nothing is kept of the graph.
    """
    seq_len = x.shape[1]
    worst = None
    for t in range(seq_len - 1):
        x_t = x.detach().requires_grad_(True)
        out, _ = split_output(module(x_t) if mask is None else module(x_t, mask))
        (grad,) = torch.autograd.grad(out[:, t].sum(), x_t, allow_unused=True)
        if grad is None:
            continue
        later = grad[:, t + 1 :].transpose(0, 1).reshape(seq_len - t - 1, -1).norm(dim=-1)
        if later.isnan().any():  # NaN is no proof of independence: report it
            return Leak(t, t + 1 + int(later.isnan().nonzero()[0]), math.nan)
        s = int(later.argmax())
        norm = float(later[s])
        if norm > 0 and (worst is None or norm > worst.grad_norm):
            worst = Leak(t, t + 1 + s, norm)
    return worst


def repeat_difference(module: nn.Module, x: Tensor, mask: Tensor | None, seed: int) -> float:
    """Max |difference| between two calls on the same input (0 for a deterministic module).

    The two calls draw from different seeds, so a module that samples (dropout) shows it; the
    global RNG is restored afterwards.
    """
    outputs = []
    with torch.no_grad():
        for s in (seed, seed + 1):
            with seeded(s):
                out, _ = split_output(module(x) if mask is None else module(x, mask))
            outputs.append(out.double())
    diff = (outputs[0] - outputs[1]).abs()
    return float(diff.nan_to_num(0.0).max()) if diff.numel() else 0.0
