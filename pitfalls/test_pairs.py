"""The checks every pair shares, parametrized once over the registry."""

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from harness.catalogue import registry
from harness.catalogue.strategies import awkward_shapes, modern_shapes
from harness.shapes import Shape
from harness.testing import (
    assert_diff_is_small_and_marked,
    assert_fixed_keeps_its_properties,
    assert_fixed_matches_sdpa,
    assert_verdict_matches_card,
)

IDS = registry.ids()
MODERN = [i for i in IDS if registry.load(i).card.modern]
CLASSIC = [i for i in IDS if i not in MODERN]


@pytest.mark.parametrize("pitfall_id", CLASSIC)
def test_fixed_matches_sdpa(pitfall_id: str, device: torch.device, dtype: torch.dtype):
    """fixed.py agrees with F.scaled_dot_product_attention on awkward shapes, under the floor."""
    pair = registry.load(pitfall_id)

    @settings(max_examples=20)
    @given(shape=awkward_shapes(pair.card.has_heads), seed=st.integers(0, 2**16))
    @example(shape=Shape(batch=2, seq_len=4, d_model=1, d_k=5, d_v=1, heads=1), seed=357)
    def check(shape: Shape, seed: int) -> None:  # the example: eight outputs, no 0.3 noise
        assert_fixed_matches_sdpa(pair, device, dtype, shape, seed)

    check()


@pytest.mark.parametrize("pitfall_id", MODERN)
def test_fixed_keeps_its_properties(pitfall_id: str, device: torch.device, dtype: torch.dtype):
    """A modern fixed.py: prefill plus one-token steps, chunked prefill and a reused cache all
    give the full forward (within the floor), and nothing reads the future."""
    pair = registry.load(pitfall_id)

    @settings(max_examples=6)
    @given(shape=modern_shapes(), seed=st.integers(0, 2**16))
    @example(shape=Shape(batch=2, seq_len=2, d_model=4, d_k=4, d_v=4, heads=1), seed=819)
    def check(shape: Shape, seed: int) -> None:  # the example: a floor that rounds near 0
        assert_fixed_keeps_its_properties(pair, device, dtype, shape, seed)

    check()


@pytest.mark.parametrize("pitfall_id", IDS)
def test_verdict_matches_card(pitfall_id: str, device: torch.device):
    """The verdict measured in float32, bfloat16 and float16 is the card's."""
    assert_verdict_matches_card(registry.load(pitfall_id), device)


@pytest.mark.parametrize("pitfall_id", IDS)
def test_diff_is_small_and_marked(pitfall_id: str):
    """buggy.py and fixed.py differ in at most 8 lines, each marked # BUG / # FIX."""
    assert_diff_is_small_and_marked(registry.load(pitfall_id))
