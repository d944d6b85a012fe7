"""The tutorial as a subject: the claims no pair measures, and its own modules as written."""

import math

import pytest

from harness.tutorial import claims
from harness.tutorial.own_code import CLASSES, diagnoses, example


def test_dot_products_spread_as_sqrt_d_k_and_the_scale_holds_them_at_one() -> None:
    spreads = claims.dot_product_spread(widths=(4, 64, 1024))
    for s in spreads:  # 4,096 pairs: the sample's standard deviation is within a few percent
        assert s.unscaled == pytest.approx(math.sqrt(s.d_k), rel=0.05)
        assert s.scaled == pytest.approx(1, rel=0.05)


def test_a_documented_mask_does_not_broadcast_to_the_scores() -> None:
    b = claims.mask_broadcast(batch=2, seq_len=3, d_v=5)
    assert b.masked == (2, 2, 3, 3)  # (B, B, T, T), not (B, T, T)
    assert b.matmul_output == (2, 2, 3, 5)
    assert "3D" in b.bmm_error


def test_bmm_keeps_the_batch_contract_and_matmul_broadcasts_past_it() -> None:
    c = claims.batch_contract(seq_len=4, d_k=8)
    assert c.bmm_error.startswith("RuntimeError")
    assert c.matmul_shape == (2, 4, 4)


@pytest.mark.parametrize(("d_model", "heads"), [(512, 8), (64, 4), (96, 3)])
def test_split_heads_keep_the_parameter_count(d_model: int, heads: int) -> None:
    assert claims.head_parameters(d_model, heads) == (4 * d_model**2, 4 * d_model**2)


def test_unnormalised_exp_is_far_from_softmax() -> None:
    u = claims.unnormalised_exp(seq_len=32, d_k=16)
    assert u.row_sum_min > 2  # exp of unit-variance scores: rows sum to about T e^(1/2)
    assert u.error_min > 1  # off by more than the output's own scale, on every seed


def test_the_tutorials_example_raises_as_written_and_is_causal_with_a_3d_mask() -> None:
    ex = example()
    assert ex.as_written == "RuntimeError: batch1 must be a 3D tensor"
    assert ex.shapes == ((1, 3, 3), (1, 3, 3))
    assert ex.lower_triangular


def test_the_doctor_passes_the_tutorials_modules_only_with_a_3d_mask() -> None:
    table = diagnoses()
    assert list(table["module"]) == [f"`{c}`" for c in CLASSES for _ in range(2)]
    three_d = table[table["mask"] == "(B, T, T)"]
    documented = table[table["mask"] == "(B, 1, T, T)"]
    assert (three_d["doctor"] == "healthy").all()
    assert three_d["what it flags"].str.contains("all-masked rows").all()  # a warning only
    assert (documented["doctor"] != "healthy").all()
    assert (
        documented["what it flags"].str.startswith("FAIL mask_rank at pitfalls/tutorial.py:").all()
    )
