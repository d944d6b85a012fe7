"""The tutorial as a subject: the claims no pair measures, and its own modules as written."""

import math

import pandas as pd
import pytest
import torch

from harness.report.tutorial_code import verdict
from harness.tutorial import claims, specialise
from harness.tutorial.own_code import CLASSES, Example, diagnoses, example


def test_dot_products_spread_as_sqrt_d_k_and_the_scale_holds_them_at_one() -> None:
    spreads = claims.dot_product_spread(widths=(4, 64, 1024))
    for s in spreads:  # 4,096 pairs: the sample's standard deviation is within a few percent
        assert s.unscaled == pytest.approx(math.sqrt(s.d_k), rel=0.05)
        assert s.scaled == pytest.approx(1, rel=0.05)


def test_with_one_dimension_a_query_can_favour_only_the_largest_or_smallest_key() -> None:
    narrow, wide = claims.discrimination(widths=(1, 16))
    assert narrow.favourites == 2  # whatever the query: a score is the key times one number
    assert wide.favourites == wide.keys


def test_two_trained_heads_take_one_look_up_each_and_twins_share_them() -> None:
    roles = specialise.head_roles()
    assert roles.tally.claim == specialise.SPLIT and roles.accuracy_min > 0.9
    twins = specialise.train(0)
    twins.attention.heads[1].load_state_dict(twins.attention.heads[0].state_dict())
    x = torch.randint(0, specialise.VOCAB, (64, specialise.SEQ_LEN))
    with torch.no_grad():
        assert specialise.roles(twins, x)[0] == specialise.SHARED  # both heads on one place


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


def test_without_the_scale_the_query_gradient_grows() -> None:
    g = claims.scale_gradients(d_k=64, batch=2, seq_len=16)
    assert g.ratio_min > 2  # larger without the scale, on every seed: nothing vanishes


def test_a_missing_transpose_raises_unless_d_k_equals_t_then_runs_wrong() -> None:
    t = claims.missing_transpose(batch=2, seq_len=4, d_k=8)
    assert t.error.startswith("RuntimeError")
    assert t.silent_error > 0.1  # it ran, and is not Q K^T


def test_nothing_converts_a_float_mask_or_a_large_fill() -> None:
    f = claims.float_masks()
    assert "boolean" in f.float_in_masked_fill
    assert "Half" in f.large_fill_in_half


def test_bmm_and_matmul_agree_to_the_bit_on_3d_tensors() -> None:
    assert claims.bmm_matches_matmul() == 0


def test_xaviers_variance_is_two_over_the_fans_summed() -> None:
    x = claims.xavier_variance(fan_in=512, fan_out=64)
    assert x.measured == pytest.approx(x.formula, rel=0.05)
    assert x.measured != pytest.approx(x.said, rel=0.2)


def test_the_tensors_reciprocal_prints_exactly() -> None:
    assert claims.tensor_reciprocal(64) == "0.125"


def test_the_tutorials_heads_run_one_after_another() -> None:
    loop = claims.head_loop(d_model=64, heads=4)
    assert loop.products_per_head == 5  # W_q, W_k, W_v, Q K^T, weights V
    assert loop.loop_products == 4 * 5 + 1  # each head in turn, then W_o


def test_softmax_without_a_dim_normalises_the_batch() -> None:
    s = claims.implicit_softmax(batch=2, seq_len=5)
    assert s.row_sum_min > 0.1  # no row of the last axis is a distribution
    assert s.nan_rows_min > 0  # rows masked in every batch element are NaN


def test_whether_the_tutorials_code_is_right_follows_its_example_and_the_doctor() -> None:
    rows = [("(B, T, T)", "healthy"), ("(B, 1, T, T)", "1 problem(s)")]
    doctor = pd.DataFrame(rows, columns=["mask", "doctor"])
    raises = Example("RuntimeError: x", ((1, 3, 3), (1, 3, 3)), True)
    said = verdict(raises, doctor)
    assert said == ("So its arithmetic is right (with a (B, T, T) mask), but its (B, 1, T, T) "
                    "mask and its example as written fail.")  # fmt: skip
    runs = Example("runs", ((1, 3, 3), (1, 3, 3)), True)
    healthy = doctor.assign(doctor="healthy")
    assert verdict(runs, healthy) == "So the tutorial's code is right as it stands."
