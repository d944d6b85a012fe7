"""mask_rank: the shared pair checks, the tutorial's own example crashing, and what @ would do."""

import re

import pytest
import torch

from harness.catalogue import registry
from harness.catalogue.compare import build_pair
from harness.catalogue.judge import measure
from pitfalls.mask_rank import CARD


def claimed_shape(before: str, shape) -> tuple[int, ...]:
    """The shape the card's truth gives after ``before``, with B, T, d_v read from ``shape``."""
    found = re.search(re.escape(before) + r" \(([^)]*)\)", CARD.truth)
    assert found, f"the card no longer says {before!r} (shape)"
    sizes = {"B": shape.batch, "T": shape.seq_len, "d_v": shape.d_v}
    return tuple(int(s) if s.isdigit() else sizes[s] for s in found[1].split(", "))


def test_tutorial_example_raises_on_its_own_sizes(device):
    pair = registry.load("mask_rank")
    shape = pair.card.shape.with_(batch=1, seq_len=3, d_model=3, d_k=2, d_v=3)  # §3.3's sizes
    m = measure(pair, device, torch.float32, shape=shape, search=False)
    message = re.search(r"bmm raises '([^']*)'", CARD.truth)
    assert message and m.error is not None and message[1] in m.error, m.error


@pytest.mark.parametrize("batch", [1, 3])
def test_with_matmul_the_output_gains_a_leading_dimension(device, batch, monkeypatch):
    """buggy.py with every bmm replaced by @ (torch.matmul): it runs, and adds a dimension."""
    pair = registry.load("mask_rank")
    shape = pair.card.shape.with_(batch=batch)
    fixed, buggy = (m.to(device) for m in build_pair(pair, shape, seed=0))
    x = pair.card.inputs(shape, 0).x.to(device, torch.float32)
    expected, _ = fixed(x)
    monkeypatch.setattr(torch, "bmm", torch.matmul)
    output, weights = buggy(x)
    assert weights.shape == claimed_shape("the weights become", shape)
    assert output.shape == claimed_shape("silently return", shape)
    assert "for every batch size" in CARD.truth
    assert torch.allclose(output[0], expected)  # the right values, one dimension deeper
