"""One comparison of a pair: its tables, weight and gradient mapping, and module probes."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from harness.catalogue import registry
from harness.catalogue.compare import compare, runs_silently
from harness.catalogue.judge import measure
from harness.catalogue.verdicts import Verdict
from harness.runner import INPUT_GRAD
from harness.shapes import Shape
from tests.helpers import Raising, correct_class, make_pair

CPU = torch.device("cpu")
SHAPE = Shape()


def test_a_raising_bug_leaves_no_numbers_in_the_output_table():
    cmp = compare(make_pair(correct_class(), Raising), CPU, torch.float32, SHAPE)
    assert cmp.diverges and not cmp.bug.ok
    out = cmp.output.set_index("run")
    assert out.loc["fix", "differs"] is False  # measured, and within its own floor
    assert out.loc["bug", "differs"] is None and math.isnan(out.loc["bug", "max_abs"])
    assert out.loc["bug", "shape"] is None
    assert out.loc["fix", "shape"] == (SHAPE.batch, SHAPE.seq_len, SHAPE.d_v)
    assert not runs_silently(make_pair(correct_class(), Raising), CPU, torch.float32, SHAPE)


class Fused(nn.Module):
    """The correct module with its projections fused into one, V first: other parameter names,
    and other initial weights from the same seed."""

    def __init__(self, d_model, d_k, d_v):
        super().__init__()
        self.sizes = [d_v, d_k, d_k]
        self.W_vqk = nn.Linear(d_model, 2 * d_k + d_v, bias=False)

    def forward(self, x, mask=None):
        V, Q, K = self.W_vqk(x).split(self.sizes, dim=-1)
        scores = torch.bmm(Q, K.transpose(1, 2)) / math.sqrt(self.sizes[1])
        if mask is not None:
            scores = scores.masked_fill(mask == 0, float("-inf"))
        weights = F.softmax(scores, dim=-1)
        return torch.bmm(weights, V), weights


NAMES = ("W_v.weight", "W_q.weight", "W_k.weight")  # in Fused's order


def fuse(state, shape):
    return {"W_vqk.weight": torch.cat([state[n] for n in NAMES])}


def unfuse(grads, shape):
    mapped = {k: v for k, v in grads.items() if k != "W_vqk.weight"}
    sizes = [shape.d_v, shape.d_k, shape.d_k]
    mapped.update(zip(NAMES, grads["W_vqk.weight"].split(sizes), strict=True))
    return mapped


def test_weights_and_gradients_are_mapped_between_different_parameter_names():
    pair = make_pair(correct_class(), Fused, to_buggy=fuse, to_fixed=unfuse)
    m = measure(pair, CPU, torch.float32)
    assert m.verdict is Verdict.BENIGN, m.reason  # the same function with the same weights
    grads = m.gradients.set_index("param")
    assert sorted(grads.index) == sorted([INPUT_GRAD, *NAMES])
    assert grads["cosine"].tolist() == pytest.approx([1.0] * 4)


def test_probes_find_a_future_leak_in_causal_traps():
    class IgnoresMask(correct_class()):
        def forward(self, x, mask=None):
            return super().forward(x)

    for kind in ("causal", "both"):
        m = measure(make_pair(correct_class(), IgnoresMask, mask=kind), CPU, torch.float32)
        leak = m.probes["future leak"]
        assert leak.startswith("fixed.py none; buggy.py output at position "), leak
        assert "depends on input" in leak
    m = measure(make_pair(correct_class(), IgnoresMask, mask="padding"), CPU, torch.float32)
    assert "future leak" not in m.probes


@pytest.mark.parametrize(
    "noise",
    [
        lambda out: F.dropout(out, p=0.5, training=True),  # dropout left on in eval
        lambda out: out + 1e-6 * torch.rand_like(out),  # however small a difference
    ],
)
def test_probes_find_randomness_in_eval_mode(noise):
    class Noisy(correct_class()):
        def forward(self, x, mask=None):
            out, weights = super().forward(x, mask)
            return noise(out), weights

    m = measure(make_pair(correct_class(), Noisy), CPU, torch.float32)
    calls = m.probes["two identical calls in eval"]
    assert calls.startswith("fixed.py identical; buggy.py differ by up to"), calls


def test_what_the_probes_find_in_buggy_py_is_a_value_apart_from_what_they_say():
    """A leak and calls that differ, found in buggy.py, by probe; nothing where buggy.py is as
    fixed.py (the symptom index reads these, not the sentences)."""

    class IgnoresMask(correct_class()):
        def forward(self, x, mask=None):
            return super().forward(x)

    class Noisy(correct_class()):
        def forward(self, x, mask=None):
            out, weights = super().forward(x, mask)
            return out + 1e-6 * torch.rand_like(out), weights

    leaky = measure(make_pair(correct_class(), IgnoresMask, mask="causal"), CPU, torch.float32)
    assert list(leaky.bug_findings) == ["future leak"]
    assert leaky.probes["future leak"].endswith(f"buggy.py {leaky.bug_findings['future leak']}")
    noisy = measure(make_pair(correct_class(), Noisy), CPU, torch.float32)
    assert noisy.bug_findings["two identical calls in eval"].startswith("differ by up to")
    same = measure(make_pair(correct_class(), correct_class()), CPU, torch.float32)
    assert same.bug_findings == {}


@pytest.mark.parametrize("pitfall", ["mask_bool", "fully_masked_row"])
def test_a_measurement_keeps_the_allowed_keys_of_the_inputs_its_tables_come_from(pitfall):
    """fully_masked_row's tables come from its edge inputs, whose mask has an all-padding row."""
    pair = registry.load(pitfall)
    m = measure(pair, CPU, torch.float32, search=False)
    assert torch.equal(m.keep, pair.card.inputs(m.shape, m.seed, m.edge).keep)
