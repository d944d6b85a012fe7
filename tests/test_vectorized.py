"""Training every seed at once: each seed computes what it would alone, and a module vmap
cannot map, or one that raises, is trained seed by seed."""

import copy

import pandas as pd
import pytest
import torch
from torch import nn

from harness.learning import Task, TinyModel, train
from harness.vectorized import Flat, together, train_seeds

SEEDS = (0, 1, 2)
STEPS = 6  # few: training amplifies rounding, and vmap batches the arithmetic differently


class Attention(nn.Module):
    """Plain single-head attention, with dropout on the weights (``p``)."""

    def __init__(self, d_model=32, d_k=8, p=0.0):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(d_model, d_k, bias=False) for _ in range(3))
        self.dropout = nn.Dropout(p)

    def forward(self, x, mask=None):
        scores = self.q(x) @ self.k(x).transpose(1, 2) / self.q.out_features**0.5  # (B, T, T)
        weights = self.dropout(scores.softmax(-1))
        return weights @ self.v(x), weights


class ReadsAValue(Attention):
    """Branches on a tensor's value, which vmap cannot map."""

    def forward(self, x, mask=None):
        out, weights = super().forward(x, mask)
        return (out if float(out.abs().max()) > 0 else -out), weights


class Raises(Attention):
    def forward(self, x, mask=None):
        raise RuntimeError("broken")


def attend(module, x, batch):
    return module(x)


def models(cls, **kw):
    built = []
    for seed in SEEDS:
        torch.manual_seed(seed)
        built.append(TinyModel(cls(**kw), 8))
    return built


def alone(cls, **kw):
    return [
        train(m, Task("recall"), attend, s, STEPS)
        for m, s in zip(models(cls, **kw), SEEDS, strict=True)
    ]


def test_each_seed_trains_as_it_would_alone_within_rounding():
    batched = together(models(Attention), Task("recall"), attend, SEEDS, STEPS, torch.device("cpu"))
    for one, many in zip(alone(Attention), batched, strict=True):
        pd.testing.assert_series_equal(one.curve["loss"], many.curve["loss"], rtol=1e-4)
        assert list(one.curve["accuracy"]) == pytest.approx(list(many.curve["accuracy"]), abs=0.1)
    losses = [run.curve["loss"].iloc[-1] for run in batched]
    assert len(set(losses)) == len(SEEDS)  # three seeds, three runs


def test_the_trained_weights_are_each_seeds_own():
    trained = models(Attention)
    together(trained, Task("recall"), attend, SEEDS, STEPS, torch.device("cpu"))
    for seed, model, alone_model in zip(SEEDS, trained, models(Attention), strict=True):
        train(alone_model, Task("recall"), attend, seed, STEPS)
        torch.testing.assert_close(model.readout.weight, alone_model.readout.weight)


def test_a_module_vmap_cannot_map_is_trained_seed_by_seed():
    with pytest.raises(RuntimeError):  # vmap refuses .item() on a batched tensor
        together(models(ReadsAValue), Task("recall"), attend, SEEDS, STEPS, torch.device("cpu"))
    runs = train_seeds(models(ReadsAValue), Task("recall"), attend, SEEDS, STEPS)
    expected = alone(ReadsAValue)
    assert [list(r.curve["loss"]) for r in runs] == [list(r.curve["loss"]) for r in expected]


def test_a_seed_whose_loss_turns_nan_stops_there_and_the_others_go_on():
    built = models(Attention)
    with torch.no_grad():
        built[1].readout.weight[0, 0] = float("nan")
    runs = train_seeds(built, Task("recall"), attend, SEEDS, STEPS)
    assert [len(r.curve) for r in runs] == [STEPS, 1, STEPS]
    assert runs[1].nonfinite_step == 1 and runs[0].nonfinite_step is None


def test_a_raise_is_the_modules_own_on_every_seed():
    runs = train_seeds(models(Raises), Task("recall"), attend, SEEDS, STEPS)
    assert [r.error for r in runs] == ["RuntimeError: broken"] * len(SEEDS)


def twins(**kw):
    """Seed 0's model twice."""
    model = models(Attention, **kw)[0]
    return [model, copy.deepcopy(model)]


def test_dropout_draws_each_seeds_masks_apart_and_the_same_way_twice():
    first = train_seeds(twins(p=0.5), Task("recall"), attend, (0, 0), STEPS)
    again = train_seeds(twins(p=0.5), Task("recall"), attend, (0, 0), STEPS)
    assert list(first[0].curve["loss"]) != list(first[1].curve["loss"])  # same seed, own masks
    assert [list(r.curve["loss"]) for r in first] == [list(r.curve["loss"]) for r in again]
    without = train_seeds(twins(), Task("recall"), attend, (0, 0), STEPS)
    assert list(without[0].curve["loss"]) == list(without[1].curve["loss"])


def test_the_global_generator_is_left_as_it_was():
    built = models(Attention, p=0.5)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    train_seeds(built, Task("recall"), attend, SEEDS, STEPS)
    assert torch.equal(torch.rand(3), expected)


def test_a_flat_leaf_holds_every_parameter_as_a_view():
    named = {"a": torch.ones(2, 3), "b": torch.zeros(4)}
    flat = Flat(named)
    views = flat.views()
    assert flat.leaf.shape == (10,) and views["a"].shape == (2, 3)
    (views["a"].sum() * 2 + views["b"].sum()).backward()
    assert flat.leaf.grad.tolist() == [2.0] * 6 + [1.0] * 4
