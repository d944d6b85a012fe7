"""A trap whose bug is the weights: judged by its attention over freshly seeded modules."""

import pytest
import torch

from harness import metrics
from harness.catalogue.compare import MeasurementError
from harness.catalogue.judge import measure
from harness.catalogue.verdicts import Verdict
from harness.inputs import make_inputs, upstream_gradient
from harness.shapes import Shape
from tests.helpers import Raising, altered_class, correct_class, make_pair, sharpened_class

CPU = torch.device("cpu")
OVER_SEEDS = dict(shared_weights=False, n_seeds=4)


def over_seeds(fixed_cls, buggy_cls, seed=0, **card):
    return measure(make_pair(fixed_cls, buggy_cls, **OVER_SEEDS, **card), CPU, torch.float32, seed)


def test_a_bug_that_saturates_most_rows_is_silent():
    m = over_seeds(correct_class(), sharpened_class(100.0))
    assert m.verdict is Verdict.SILENT, m.reason
    assert m.seeds == 4 and "over 4 seeds" in m.reason
    att = m.attention.set_index("run")
    assert metrics.degenerate(att.loc["bug", "saturated"])
    assert att.loc["fix", "saturated"] == 0.0


def test_two_healthy_modules_are_benign_over_seeds():
    m = over_seeds(correct_class(), correct_class())
    assert m.verdict is Verdict.BENIGN, m.reason


def test_a_bug_is_not_blamed_when_the_fixed_module_saturates_as_much():
    m = over_seeds(sharpened_class(100.0), sharpened_class(100.0))
    assert m.verdict is Verdict.BENIGN, m.reason


def test_a_raising_bug_is_loud_over_seeds_and_a_raising_fix_is_an_invalid_measurement():
    m = over_seeds(correct_class(), Raising)
    assert m.verdict is Verdict.LOUD and m.error == "RuntimeError: deliberate failure"
    with pytest.raises(MeasurementError, match="the fixed module fails"):
        over_seeds(Raising, correct_class())


def test_gradient_table_over_seeds_has_every_parameter_and_the_norm_ratio():
    m = over_seeds(correct_class(), altered_class(grad_gain=1.0))  # every gradient doubled
    grads = m.gradients.set_index("param")
    assert list(grads.index) == ["W_q.weight", "W_k.weight", "W_v.weight"]
    assert grads["ratio"].tolist() == pytest.approx([2.0] * 3, rel=1e-6)


def independent_stats(cls, shape: Shape, seeds: range, mask: str):
    """Attention statistics and the W_q gradient norm averaged over ``seeds``, computed here."""
    rows, norms = [], []
    for seed in seeds:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = cls(shape.d_model, shape.d_k, shape.d_v)
        inputs = make_inputs(shape, seed, mask)
        out, weights = module(inputs.x.float(), inputs.keep)
        loss = (out * upstream_gradient(out.shape, seed).float()).sum()
        (grad,) = torch.autograd.grad(loss, [module.W_q.weight])
        rows.append(metrics.attention_stats(weights.detach().double(), inputs.keep))
        norms.append(grad.norm().item())
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in ("entropy_mean", "saturated")}
    return dict(
        **mean,
        entropy_min=min(r["entropy_min"] for r in rows),
        grad_norm=sum(norms) / len(norms),
    )


def test_statistics_over_seeds_match_an_independent_computation():
    # Moderately sharpened: the seeds differ in how many rows saturate, so mean, min and max
    # tell apart; seeds 3..6, not 0..3.
    cls, seed = sharpened_class(10.0), 3
    m = over_seeds(cls, correct_class(), seed=seed, mask="padding")
    want = independent_stats(cls, m.shape, range(seed, seed + 4), "padding")
    fix = m.attention.set_index("run").loc["fix"]
    for key in ("entropy_mean", "entropy_min", "saturated"):
        assert fix[key] == pytest.approx(want[key], rel=1e-6, abs=1e-12), key
    norm = m.gradients.set_index("param").loc["W_q.weight", "norm_fix"]
    assert norm == pytest.approx(want["grad_norm"], rel=1e-5)
