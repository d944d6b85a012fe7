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
    # Taken in the dtype: a few ulps of the dtype at magnitude ~2, not float64's far smaller ones.
    assert eps <= tol <= 8 * eps


def test_atol_ignores_non_finite_reference_values(dtype):
    ref = torch.tensor([1.5, math.inf, -math.inf, math.nan, -1.25], dtype=torch.float64)
    tol = metrics.atol(ref, dtype)
    assert math.isfinite(tol) and tol <= 8 * torch.finfo(dtype).eps


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


def test_error_counts_a_candidate_below_the_reference():
    ref = torch.tensor([3.0, 4.0], dtype=torch.float64)
    err = metrics.error(torch.tensor([3.0, 3.25], dtype=torch.float64), ref)
    assert err.max_abs == pytest.approx(0.75)


def test_error_treats_matching_nan_and_inf_as_agreement():
    ref = torch.tensor([math.nan, math.inf, -math.inf, 1.0], dtype=torch.float64)
    test = torch.tensor([math.nan, math.inf, -math.inf, 1.5], dtype=torch.float64)
    err = metrics.error(test, ref)
    assert err.max_abs == pytest.approx(0.5)
    assert err.rel_l2 == pytest.approx(0.5)  # relative to the finite part of the reference


def test_error_of_an_infinity_with_the_wrong_sign_is_infinite():
    ref = torch.tensor([math.inf, 1.0], dtype=torch.float64)
    assert metrics.error(torch.tensor([-math.inf, 1.0], dtype=torch.float64), ref).max_abs == (
        math.inf
    )


def test_an_exact_match_never_differs_even_without_tolerance():
    exact = metrics.Error(0.0, 0.0)
    assert not metrics.differs(exact, exact, 0.0, metrics.OUTPUT_FACTOR)
    assert metrics.differs(metrics.Error(1e-300, 0.0), exact, 0.0, metrics.OUTPUT_FACTOR)


def test_saturation_is_counted_per_row_not_per_key():
    # Rows 0 and 1 put all their weight on key 0; rows 2 and 3 are uniform. Half the rows are
    # saturated, though only one key (column) ever receives a large weight.
    weights = torch.full((1, 4, 4), 0.25, dtype=torch.float64)
    weights[0, :2] = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    assert metrics.attention_stats(weights, None)["saturated"] == 0.5
    every_row_on_key_0 = torch.zeros(2, 3, 5, dtype=torch.float64)
    every_row_on_key_0[..., 0] = 1.0
    assert metrics.attention_stats(every_row_on_key_0, None)["saturated"] == 1.0


def test_a_row_whose_largest_weight_is_exactly_the_threshold_is_saturated():
    weights = torch.tensor([[[0.99, 0.01], [0.98, 0.02]]], dtype=torch.float64)
    assert metrics.attention_stats(weights, None)["saturated"] == 0.5


def test_multi_head_entropy_is_normalized_by_the_shared_mask():
    batch, heads, seq = 2, 3, 4  # batch != heads: the (B, T, T) mask must go to every head
    keep = torch.ones(batch, seq, seq, dtype=torch.bool).tril()
    uniform = keep.double() / keep.sum(-1, keepdim=True)  # uniform over the allowed keys
    weights = uniform[:, None].expand(batch, heads, seq, seq)
    stats = metrics.attention_stats(weights, keep)
    assert stats["entropy_mean"] == pytest.approx(1.0)
    assert stats["entropy_min"] == pytest.approx(1.0)


def test_a_cached_scenarios_floor_is_never_below_one_ulp_of_the_output():
    """The floor of a cached call is the same module's full forward; where that rounds almost
    exactly, the floor is one ulp of the output's largest value instead."""
    from harness.consistency import at_least_one_ulp

    ref = torch.tensor([0.5, -2.0, float("nan")], dtype=torch.float64)
    tiny = metrics.Error(1e-9, 1e-9)
    assert at_least_one_ulp(tiny, ref, torch.float32).max_abs == torch.finfo(torch.float32).eps * 2
    wide = metrics.Error(1e-3, 1e-3)
    assert at_least_one_ulp(wide, ref, torch.float32) is wide
