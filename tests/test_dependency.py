"""Dependency by redrawing inputs: split points, exact leak positions, samplers, NaN."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.dependency import MAX_SPLITS, Redraws, future_leak, splits


class Window(nn.Module):
    """Causal attention on SDPA that also sees ``ahead`` positions into the future (0: causal)."""

    def __init__(self, d_model: int = 16, ahead: int = 0, only_at: int | None = None):
        super().__init__()
        torch.manual_seed(0)
        self.qkv = nn.Linear(d_model, 3 * d_model).double()
        self.ahead, self.only_at = ahead, only_at

    def forward(self, x: Tensor) -> Tensor:
        T = x.shape[1]
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        keep = torch.ones(T, T, dtype=torch.bool).tril(self.ahead)
        if self.only_at is not None:  # the leak is at one query only
            keep = torch.ones(T, T, dtype=torch.bool).tril()
            keep[self.only_at, self.only_at + self.ahead] = True
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def x_of(seq_len: int, batch: int = 2, d_model: int = 16) -> Tensor:
    return torch.randn(batch, seq_len, d_model, generator=torch.Generator().manual_seed(1),
                       dtype=torch.float64)  # fmt: skip


def test_every_split_on_short_sequences_and_a_spread_with_both_ends_on_long_ones():
    assert splits(8) == list(range(1, 8))
    long = splits(256)
    assert len(long) == MAX_SPLITS and long[0] == 1 and long[-1] == 255
    assert long == sorted(set(long))


def test_a_causal_module_does_not_leak_at_any_length():
    for seq_len in (3, 8, 40, 200):
        assert future_leak(Window(), x_of(seq_len)) is None


@pytest.mark.parametrize("seq_len", [8, 100])
def test_a_leak_names_the_first_query_and_the_latest_input_it_reads(seq_len):
    leak = future_leak(Window(ahead=3), x_of(seq_len))
    assert (leak.query, leak.key) == (0, 3), leak
    assert leak.change > 0 and "output at position 0 depends on input 3" in str(leak)


def test_a_leak_at_one_query_on_a_long_sequence_is_found_across_a_split():
    """Query 30 also sees input 90: splits between them catch it, the binary search pins it."""
    leak = future_leak(Window(ahead=60, only_at=30), x_of(128))
    assert (leak.query, leak.key) == (30, 90), leak


def test_a_module_that_samples_is_not_taken_for_a_leak():
    """Both calls of a redraw run under one seed: dropout draws the same mask each time."""

    class CausalDropout(Window):
        def forward(self, x):
            return F.dropout(super().forward(x), p=0.5, training=True)

    assert future_leak(CausalDropout(), x_of(8)) is None


def test_an_output_that_is_nan_either_time_is_no_proof_of_independence():
    x = x_of(6)
    moved = torch.zeros(2, 6, dtype=torch.bool)
    moved[:, -1] = True

    def turns_nan_at_0(inputs: Tensor) -> Tensor:  # finite on x itself, NaN at 0 otherwise
        out = torch.zeros_like(inputs)
        out[:, 0] = 0.0 if torch.equal(inputs, x) else math.nan
        return out

    change = Redraws(turns_nan_at_0, x).change(moved)
    assert change[:, 0].isnan().all() and (change[:, 1:] == 0).all()
    assert Redraws(lambda x: torch.full_like(x, math.nan), x).change(moved).isnan().all()
