"""scale_precision: the shared pair checks, and the scale values themselves."""

import torch

from harness.catalogue import registry
from pitfalls.scale_precision import scale_table


def test_tensor_scale_for_64_is_exactly_one_eighth():
    assert (1 / torch.sqrt(torch.tensor(64.0))).item() == 0.125


def test_dividing_by_float_or_tensor_gives_identical_scores(device):
    table = scale_table(registry.load("scale_precision"), device, torch.float32)
    assert (table["scores differing (÷ float vs ÷ tensor)"] == 0).all()
    assert table["softmax identical"].all()
    assert table["max ulp (× 1/float vs ÷ tensor)"].max() <= 2
