"""Verdicts on synthetic pairs whose answer is known."""

import pytest
import torch

from harness.catalogue.judge import measure
from harness.catalogue.verdicts import Verdict
from harness.runner import INPUT_GRAD
from tests.helpers import Raising, correct_class, make_pair, offset_class

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
