"""Card for init_variance: is nn.Linear's default init too large or too small for attention?"""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd
import torch
from torch import Tensor, nn

from harness import metrics
from harness.catalogue.card import Card, Pair, Verdict
from harness.runner import seed_stats, seeded
from harness.shapes import Shape

# Each init of W_q, W_k, W_v: what it does to a weight, and its variance for (fan_in, fan_out).
INITS: dict[str, tuple[Callable[[Tensor], object], Callable[[int, int], float]]] = {
    "nn.Linear default": (lambda w: nn.init.kaiming_uniform_(w, a=math.sqrt(5)),
                          lambda fan_in, fan_out: 1 / (3 * fan_in)),
    "xavier_uniform_": (nn.init.xavier_uniform_, lambda fan_in, fan_out: 2 / (fan_in + fan_out)),
    "normal_(std=1)": (lambda w: nn.init.normal_(w, std=1.0), lambda fan_in, fan_out: 1.0),
}  # fmt: skip


def _built_with(pair: Pair, init: Callable[[Tensor], object]) -> Callable[[Shape], nn.Module]:
    """Build the fixed module, then draw W_q, W_k, W_v again with ``init``."""

    def build(shape: Shape) -> nn.Module:
        module = pair.card.build(pair.fixed, shape)
        for layer in (module.W_q, module.W_k, module.W_v):
            init(layer.weight)
        return module

    return build


def init_table(pair: Pair, device: torch.device, dtype: torch.dtype) -> pd.DataFrame:
    """The three inits side by side, over the card's seeds: weight variance (the formula and
    as drawn), attention entropy and saturation, gradient norms."""
    card = pair.card
    shape = card.shape
    rows = []
    for name, (init, variance) in INITS.items():
        build = _built_with(pair, init)
        stats = seed_stats(build, card.inputs, card.spec, device, dtype, shape, range(card.n_seeds))
        att, norms = stats.attention, stats.grad_norms
        with seeded(0):
            measured = build(shape).W_q.weight.var().item()
        rows.append(
            {
                "init": name,
                "weight variance (theory)": variance(shape.d_model, shape.d_k),
                "weight variance (measured)": measured,
                "entropy (mean)": att.get("entropy_mean", float("nan")),
                "saturated rows": att.get("saturated", float("nan")),
                "grad norm W_q": norms.get("W_q.weight", float("nan")),
                "grad norm W_v": norms.get("W_v.weight", float("nan")),
                "degenerate": metrics.degenerate(att["saturated"]) if att else None,
                "error": stats.error or "",
            }
        )
    table = pd.DataFrame(rows)
    table.attrs["caption"] = f"Three inits of W_q, W_k, W_v over {card.n_seeds} seeds"
    return table


CARD = Card(
    id="init_variance",
    title="Is nn.Linear's default init wrong for attention?",
    section="§4.5",
    category="initialisation",
    claim=(
        "nn.Linear's default kaiming_uniform_ makes QK^T too large or too small; use "
        "xavier_uniform_, 'whose variance is 1/fan_in'."
    ),
    trap="Keeping nn.Linear's default init of W_q, W_k, W_v instead of xavier_uniform_.",
    truth=(
        "A myth. nn.Linear's default has variance 1/(3 fan_in) and xavier_uniform_ "
        "2/(fan_in + fan_out), not 1/fan_in: at d_model 512, d_k 64 xavier's is the larger, "
        "5.3x. Both give healthy attention over 16 seeds (no saturated rows); xavier's is the "
        "sharper of the two, not the default's. The real trap is a far larger init, "
        "normal_(std=1) (init_unit_variance)."
    ),
    why=(
        "Swapping inits to cure a problem the default does not have costs nothing, but it "
        "hides the init that does saturate attention."
    ),
    avoid="Keep the default or xavier; check the attention entropy at initialisation.",
    expected=Verdict.BENIGN,
    shared_weights=False,
    shape=Shape(batch=4, seq_len=16, d_model=512, d_k=64, d_v=64),
    extra=init_table,
)
