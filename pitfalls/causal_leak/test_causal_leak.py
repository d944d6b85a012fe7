"""causal_leak: the shared pair checks, and the leak found by gradient dependency."""

import re

import torch

from harness.catalogue import registry
from harness.catalogue.judge import measure
from pitfalls.causal_leak import CARD


def test_gradient_dependency_finds_the_next_position(device):
    ahead = re.search(r"output t depending on input t \+ (\d+)\.", CARD.truth)
    assert ahead, "the card no longer says how far ahead the leak reaches"
    leak = measure(registry.load("causal_leak"), device, torch.float32).probes["future leak"]
    assert leak.startswith("fixed.py none; buggy.py output at position")
    found = re.search(r"position (\d+) depends on input (\d+)", leak)
    assert found and int(found[2]) == int(found[1]) + int(ahead[1]), leak
