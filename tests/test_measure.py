"""Verdicts on synthetic pairs whose answer is known."""

import pytest
import torch

from harness.catalogue.card import multi_head
from harness.catalogue.judge import measure
from harness.catalogue.verdicts import Verdict
from harness.runner import INPUT_GRAD
from harness.shapes import Shape
from tests.helpers import (
    MultiHead,
    MultiHeadSplitByView,
    Raising,
    altered_class,
    correct_class,
    detached_key_class,
    make_pair,
    offset_class,
)

CPU = torch.device("cpu")


def test_two_identical_modules_are_benign(dtype):
    m = measure(make_pair(correct_class(), correct_class()), CPU, dtype)
    assert m.verdict is Verdict.BENIGN, m.reason
    grads = m.gradients.set_index("param")
    assert grads["cosine"].tolist() == pytest.approx([1.0] * len(grads))
    assert grads.loc[INPUT_GRAD, "err_fix"] == grads.loc[INPUT_GRAD, "err_bug"]


def test_a_perturbed_module_is_silent():
    m = measure(make_pair(correct_class(), offset_class(1e-4)), CPU, torch.float32)
    assert m.verdict is Verdict.SILENT
    assert "output error" in m.reason


def test_a_perturbation_below_the_noise_floor_is_benign():
    m = measure(make_pair(correct_class(), offset_class(1e-9)), CPU, torch.float32)
    assert m.verdict is Verdict.BENIGN, m.reason


def test_a_raising_module_is_loud_with_its_error():
    m = measure(make_pair(correct_class(), Raising), CPU, torch.float32)
    assert m.verdict is Verdict.LOUD
    assert m.error == "RuntimeError: deliberate failure"
    assert m.trigger is None


def test_measurement_is_deterministic():
    pair = make_pair(correct_class(), offset_class(1e-4), mask="padding")
    a, b = measure(pair, CPU, torch.float32, seed=5), measure(pair, CPU, torch.float32, seed=5)
    assert a.output.equals(b.output) and a.gradients.equals(b.gradients)


def test_measurement_leaves_the_global_rng_alone():
    state = torch.get_rng_state()
    measure(make_pair(correct_class(), offset_class(1e-4)), CPU, torch.float32)
    assert torch.equal(state, torch.get_rng_state())


def test_summary_row_has_the_report_columns():
    row = measure(make_pair(correct_class(), offset_class(1e-4)), CPU, torch.float32).summary()
    assert row["verdict"] == "SILENT" and row["err_bug"] > row["threshold"] > 0
    assert 0 < row["entropy_fix"] <= 1


# A fixed module that is exact in float64 but off by DELTA below it sets the noise floor to DELTA,
# far above float32's rounding, so a bug's error can be placed at a known multiple of the floor.
DELTA = 1e-3


@pytest.mark.parametrize(("multiple", "verdict"), [(1.5, Verdict.BENIGN), (2.5, Verdict.SILENT)])
def test_output_differs_beyond_twice_the_floor(multiple, verdict):
    fixed = altered_class(offset=DELTA, low_precision_only=True)
    m = measure(make_pair(fixed, altered_class(offset=multiple * DELTA)), CPU, torch.float32)
    assert m.verdict is verdict, m.reason
    out = m.output.set_index("run")
    assert out.loc["fix", "max_abs"] == pytest.approx(DELTA, rel=1e-3)
    assert out.loc["bug", "max_abs"] == pytest.approx(multiple * DELTA, rel=1e-3)
    assert out.loc["bug", "threshold"] == pytest.approx(2 * DELTA, rel=1e-3)
    assert not m.gradients["differs"].any()


@pytest.mark.parametrize(("multiple", "verdict"), [(2.5, Verdict.BENIGN), (3.5, Verdict.SILENT)])
def test_gradients_differ_beyond_three_times_the_floor(multiple, verdict):
    fixed = altered_class(grad_gain=DELTA, low_precision_only=True)
    m = measure(make_pair(fixed, altered_class(grad_gain=multiple * DELTA)), CPU, torch.float32)
    assert m.verdict is verdict, m.reason
    grads = m.gradients.set_index("param")
    assert (grads["err_bug"] / grads["err_fix"]).tolist() == pytest.approx(
        [multiple] * len(grads), rel=1e-3
    )
    assert grads["differs"].tolist() == [verdict is Verdict.SILENT] * len(grads)
    assert not m.output.set_index("run").loc["bug", "differs"]


def test_a_bug_only_in_the_backward_pass_is_silent():
    gain = 0.01  # forward bit-identical; every gradient 1% too large
    m = measure(make_pair(correct_class(), altered_class(grad_gain=gain)), CPU, torch.float32)
    assert m.verdict is Verdict.SILENT, m.reason
    assert m.reason.startswith("gradient of "), m.reason
    out = m.output.set_index("run")
    assert out.loc["bug", "max_abs"] == out.loc["fix", "max_abs"]
    assert not out.loc["bug", "differs"]
    grads = m.gradients.set_index("param")
    named = m.reason.removeprefix("gradient of ").split(":")[0]
    assert named in grads.index and grads.loc[named, "err_bug"] > grads.loc[named, "threshold"]
    assert grads["differs"].all()
    assert grads["ratio"].tolist() == pytest.approx([1 + gain] * len(grads), rel=1e-5)
    assert grads["cosine"].tolist() == pytest.approx([1.0] * len(grads))


def test_a_detached_key_is_silent_and_its_gradient_is_all_zeros():
    m = measure(make_pair(correct_class(), detached_key_class()), CPU, torch.float32)
    assert m.verdict is Verdict.SILENT, m.reason
    assert "gradient of" in m.reason
    assert not m.output.set_index("run").loc["bug", "differs"]
    grads = m.gradients.set_index("param")
    assert grads.loc["W_k.weight", "differs"] and grads.loc[INPUT_GRAD, "differs"]
    assert not grads.loc["W_q.weight", "differs"] and not grads.loc["W_v.weight", "differs"]
    assert grads.loc["W_k.weight", "zero_frac_bug"] == 1.0
    assert grads.loc["W_k.weight", "zero_frac_fix"] == 0.0
    assert grads.loc["W_k.weight", "norm_bug"] == 0.0 < grads.loc["W_k.weight", "norm_fix"]
    assert grads.loc["W_q.weight", "cosine"] == pytest.approx(1.0)
    assert m.summary()["grad_cosine_min"] == 0.0  # the dead W_k gradient


def test_a_bug_with_the_wrong_output_shape_is_silent_not_loud():
    class Truncated(correct_class()):
        def forward(self, x, mask=None):
            out, weights = super().forward(x, mask)
            return out[..., :-1], weights  # runs; only a later layer would notice

    m = measure(make_pair(correct_class(), Truncated), CPU, torch.float32)
    assert m.verdict is Verdict.SILENT, m.reason
    assert m.reason == "output shape (2, 5, 5) instead of (2, 5, 6)"


def test_raised_tells_a_raising_bug_from_a_running_one():
    silent = measure(make_pair(correct_class(), offset_class(1e-4)), CPU, torch.float32)
    assert not silent.raised
    loud = measure(make_pair(correct_class(), Raising), CPU, torch.float32, search=False)
    assert loud.verdict is Verdict.LOUD and loud.raised


def test_summary_reports_the_floor_below_the_bug():
    row = measure(make_pair(correct_class(), offset_class(1e-4)), CPU, torch.float32).summary()
    assert 0 < row["floor"] < row["threshold"] < row["err_bug"]
    assert row["err_bug"] == pytest.approx(1e-4, rel=1e-2)


# Edge inputs: a bug that misbehaves only on large activations (the card's "large" edge).
LARGE = dict(edge="large", input_scale=100.0)


def large_input_class(effect: str, threshold: float = 50.0):
    """The correct module, except on inputs beyond ``threshold``: NaN, raise, or an offset."""
    base = correct_class()

    class OnLargeInputs(base):
        def forward(self, x, mask=None):
            out, weights = super().forward(x, mask)
            if x.abs().max() <= threshold:
                return out, weights
            if effect == "raise":
                raise OverflowError("too large")
            return (out * float("nan") if effect == "nan" else out + 1.0), weights

    return OnLargeInputs


@pytest.mark.parametrize(
    ("effect", "verdict", "said"),
    [
        ("nan", Verdict.NUMERIC, "with large activations: output"),
        ("raise", Verdict.NUMERIC, "with large activations, raises: OverflowError: too large"),
        ("offset", Verdict.SILENT, "with large activations: output error"),
    ],
)
def test_a_bug_seen_only_on_edge_inputs(effect, verdict, said):
    m = measure(make_pair(correct_class(), large_input_class(effect), **LARGE), CPU, torch.float32)
    assert m.verdict is verdict, m.reason
    assert m.reason.startswith(said), m.reason
    assert m.edge


def test_a_bug_fine_also_on_edge_inputs_is_benign():
    pair = make_pair(correct_class(), large_input_class("nan", threshold=1e6), **LARGE)
    m = measure(pair, CPU, torch.float32)
    assert m.verdict is Verdict.BENIGN, m.reason
    assert m.reason == "within the floor, also with large activations"


def test_edge_inputs_beyond_the_dtype_tell_nothing():
    # 1e40 overflows float32: even fixed.py is non-finite there, so the NaN of the bug is no sign.
    pair = make_pair(correct_class(), correct_class(), edge="large", input_scale=1e40)
    m = measure(pair, CPU, torch.float32)
    assert m.verdict is Verdict.INCONCLUSIVE, m.reason  # not BENIGN: nothing was shown
    assert "even fixed.py is non-finite" in m.reason


MULTI_HEAD = dict(build=multi_head, has_heads=True, shape=Shape(2, 5, 16, 4, 4, 4))


def test_a_multi_head_bug_is_also_judged_with_one_head():
    m = measure(make_pair(MultiHead, MultiHeadSplitByView, **MULTI_HEAD), CPU, torch.float32)
    assert m.verdict is Verdict.SILENT, m.reason
    assert m.variants["1 head"].startswith("BENIGN"), m.variants


def test_no_one_head_variant_where_there_is_only_one_head():
    one_head = Shape(2, 5, 16, 16, 16, 1)
    pair = make_pair(MultiHead, MultiHeadSplitByView, **MULTI_HEAD)
    m = measure(pair, CPU, torch.float32, shape=one_head)
    assert m.verdict is Verdict.BENIGN, m.reason  # splitting one head cannot mix positions
    assert m.variants == {}  # the measurement is the one-head case already
    assert (
        measure(make_pair(correct_class(), offset_class(1e-4)), CPU, torch.float32).variants == {}
    )
