"""The statistics behind every verdict."""

import math

import pytest
import torch

from harness import metrics


def test_uniform_rows_have_normalized_entropy_one():
    weights = torch.full((2, 4, 4), 0.25, dtype=torch.float64)
    stats = metrics.attention_stats(weights, None)
    assert stats["entropy_mean"] == pytest.approx(1.0)
    assert stats["entropy_min"] == pytest.approx(1.0)
    assert stats["saturated"] == 0.0


def test_one_hot_rows_have_entropy_zero_and_are_saturated():
    weights = torch.eye(4, dtype=torch.float64).expand(2, 4, 4)
    stats = metrics.attention_stats(weights, None)
    assert stats["entropy_mean"] == 0.0
    assert stats["saturated"] == 1.0


def test_entropy_is_normalized_by_allowed_keys():
    keep = torch.ones(1, 4, 4, dtype=torch.bool).tril()  # row t allows t + 1 keys
    weights = keep.double() / keep.sum(-1, keepdim=True)  # uniform over the allowed keys
    stats = metrics.attention_stats(weights, keep)
    assert stats["entropy_mean"] == pytest.approx(1.0)  # the 1-key row is left out


def test_nan_rows_are_counted_and_left_out_of_the_entropy():
    weights = torch.full((1, 3, 3), 1 / 3, dtype=torch.float64)
    weights[0, 2] = float("nan")
    stats = metrics.attention_stats(weights, None)
    assert stats["nan_rows"] == 1
    assert stats["entropy_mean"] == pytest.approx(1.0)


def test_row_sum_error_is_measured():
    weights = torch.full((1, 2, 4), 0.25, dtype=torch.float64)
    weights[0, 1] *= 1.5
    assert metrics.attention_stats(weights, None)["row_sum_err"] == pytest.approx(0.5)


def test_cosine_of_identical_gradients_is_one():
    g = torch.randn(5, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert metrics.cosine(g, g.clone()) == pytest.approx(1.0)
    assert metrics.cosine(g, -g) == pytest.approx(-1.0)


def test_error_is_infinite_for_nan_or_shape_mismatch():
    ref = torch.zeros(3, dtype=torch.float64)
    assert metrics.error(torch.tensor([0.0, float("nan"), 0.0]), ref) == metrics.INFINITE
    assert metrics.error(torch.zeros(4), ref) == metrics.INFINITE
    assert metrics.error(None, ref) == metrics.INFINITE


def test_error_measures_max_abs_and_relative_l2():
    ref = torch.tensor([3.0, 4.0], dtype=torch.float64)
    err = metrics.error(torch.tensor([3.0, 4.5], dtype=torch.float64), ref)
    assert err.max_abs == pytest.approx(0.5)
    assert err.rel_l2 == pytest.approx(0.1)


def test_atol_is_the_rounding_of_one_add_subtract(dtype):
    ref = torch.linspace(-2, 2, 101, dtype=torch.float64)
    tol = metrics.atol(ref, dtype)
    eps = torch.finfo(dtype).eps
    assert 0 < tol <= 8 * eps  # a few ulps at magnitude ~2


def test_floor_rule_uses_factor_times_floor_plus_atol():
    floor = metrics.Error(1e-6, 0.0)
    assert not metrics.differs(metrics.Error(2.5e-6, 0.0), floor, 1e-6, 2.0)
    assert metrics.differs(metrics.Error(3.5e-6, 0.0), floor, 1e-6, 2.0)
    assert metrics.differs(metrics.Error(math.inf, math.inf), floor, 1.0, 2.0)


def test_grad_stats_count_zeros_and_non_finite():
    assert metrics.grad_stats(torch.tensor([0.0, 3.0, 4.0]))["norm"] == pytest.approx(5.0)
    stats = metrics.grad_stats(torch.tensor([0.0, 3.0, 4.0, float("nan")]))
    assert math.isnan(stats["norm"])  # a NaN gradient has no meaningful norm
    assert stats["zero_frac"] == 0.25
    assert stats["nonfinite"] == 1
