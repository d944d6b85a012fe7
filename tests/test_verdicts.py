"""How per-dtype verdicts combine."""

import pytest

from harness.catalogue.verdicts import Verdict, combine
from harness.shapes import Shape

B, S, L, N = Verdict.BENIGN, Verdict.SILENT, Verdict.LOUD, Verdict.NUMERIC


def test_same_verdict_everywhere_stands():
    assert combine({"float32": S, "bfloat16": S, "float16": S}) is S


def test_benign_in_float32_but_broken_in_low_precision_is_numeric():
    assert combine({"float32": B, "bfloat16": B, "float16": L}) is N


def test_float32_decides_when_it_is_not_benign():
    assert combine({"float32": L, "float16": S}) is L


def test_float64_counts_as_full_precision():
    assert combine({"float64": B, "float16": L}) is N
    assert combine({"float16": S, "float64": L}) is L  # full precision decides, wherever listed


def test_without_full_precision_the_first_dtype_stands():
    assert combine({"bfloat16": B, "float16": L}) is B
    assert combine({"float16": L, "bfloat16": B}) is L


def test_inconclusive_dtypes_say_nothing_either_way():
    i = Verdict.INCONCLUSIVE
    assert combine({"float32": B, "bfloat16": B, "float16": i}) is B  # not NUMERIC
    assert combine({"float32": i, "float16": L}) is L
    assert combine({"float32": i, "float16": i}) is i


def test_combine_needs_something():
    with pytest.raises(ValueError):
        combine({})


def test_shape_rejects_bad_sizes():
    with pytest.raises(ValueError, match="positive"):
        Shape(batch=0)
    with pytest.raises(ValueError, match="divisible"):
        Shape(d_model=10, heads=4)
