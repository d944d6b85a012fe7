"""mask_rank: the shared pair checks, and the tutorial's own example crashing."""

import torch

from harness.catalogue import registry
from harness.catalogue.judge import measure


def test_tutorial_example_raises_on_its_own_sizes(device):
    pair = registry.load("mask_rank")
    shape = pair.card.shape.with_(batch=1, seq_len=3, d_model=3, d_k=2, d_v=3)  # §3.3's sizes
    m = measure(pair, device, torch.float32, shape=shape, search=False)
    assert m.error is not None and "3D" in m.error
