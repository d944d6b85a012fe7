"""Trap-specific experiments, checked against independent computations."""

import pytest
import torch

from harness.catalogue import registry
from harness.inputs import upstream_gradient
from harness.shapes import Shape

CPU = torch.device("cpu")


def mean_grad_norms(cls, shape: Shape, card, seeds: range) -> dict[str, float]:
    """Per parameter, the gradient norm of sum(out * G) averaged over ``seeds``, computed here."""
    totals: dict[str, float] = {}
    for seed in seeds:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = cls(shape.d_model, shape.d_k, shape.d_v)
        inputs = card.inputs(shape, seed)
        out, _ = module(inputs.x.float())
        loss = (out * upstream_gradient(out.shape, seed).float()).sum()
        params = dict(module.named_parameters())
        grads = torch.autograd.grad(loss, list(params.values()))
        for name, grad in zip(params, grads, strict=True):
            totals[name] = totals.get(name, 0.0) + grad.norm().item() / len(seeds)
    return totals


def test_missing_scale_sweep_reports_the_query_projection_gradient():
    pair = registry.load("missing_scale")
    table = pair.card.extra(pair, CPU, torch.float32).set_index("d_k")
    for d_k in (8, 256):  # the ends of the sweep
        shape = Shape(batch=4, seq_len=16, d_model=64, d_k=d_k, d_v=16)
        for side, module in (("fixed", pair.fixed), ("buggy", pair.buggy)):
            norms = mean_grad_norms(module.ScaledDotProductAttention, shape, pair.card, range(4))
            reported = table.loc[d_k, f"grad norm W_q ({side})"]
            assert reported == pytest.approx(norms["W_q.weight"], rel=1e-4), (d_k, side)
            # W_k's gradient norm is close but distinguishable at this tolerance: not it.
            assert reported != pytest.approx(norms["W_k.weight"], rel=1e-3), (d_k, side)
