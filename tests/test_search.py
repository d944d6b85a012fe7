"""Trigger search: a bug that raises on most shapes is CONDITIONAL on the smallest shape where it
runs and diverges."""

import torch

from harness.catalogue.compare import runs_silently
from harness.catalogue.judge import measure
from harness.catalogue.verdicts import Verdict
from harness.shapes import Shape
from tests.helpers import correct_class, make_pair

CPU = torch.device("cpu")


def picky_class() -> type[torch.nn.Module]:
    """Raises unless batch == seq_len == 4; where it runs, it is wrong only when d_v >= 2."""
    base = correct_class()

    class Picky(base):
        def forward(self, x, mask=None):
            batch, seq_len, _ = x.shape
            if not batch == seq_len == 4:
                raise RuntimeError(f"shape mismatch: {batch} != {seq_len}")
            out, weights = super().forward(x, mask)
            return (out + 1.0 if out.shape[-1] >= 2 else out), weights

    return Picky


# The smallest shape on which Picky runs and diverges: every free size at its minimum.
SMALLEST = Shape(batch=4, seq_len=4, d_model=1, d_k=1, d_v=2, heads=1)


def test_a_bug_that_runs_only_on_some_shapes_is_conditional_on_the_smallest():
    pair = make_pair(correct_class(), picky_class())
    m = measure(pair, CPU, torch.float32)
    assert m.verdict is Verdict.CONDITIONAL, m.reason
    assert m.trigger == SMALLEST
    assert m.reason.startswith(f"raises on {pair.card.shape.label()}; ")
    assert f"runs silently on {SMALLEST.label()}: output error" in m.reason
    # The tables come from the trigger shape, where the bug ran and diverged.
    assert m.shape == SMALLEST and not m.raised
    assert m.output.set_index("run").loc["bug", "differs"]
    assert m.error == "RuntimeError: shape mismatch: 2 != 5"


def test_runs_silently_needs_both_running_and_diverging():
    pair = make_pair(correct_class(), picky_class())
    assert runs_silently(pair, CPU, torch.float32, SMALLEST)
    assert not runs_silently(pair, CPU, torch.float32, SMALLEST.with_(d_v=1))  # runs, exact
    assert not runs_silently(pair, CPU, torch.float32, SMALLEST.with_(batch=3))  # raises
