"""dropout_in_eval: the shared pair checks, and randomness in eval mode."""

import torch

from harness.catalogue import registry
from harness.catalogue.judge import measure


def test_two_eval_calls_differ_only_for_the_bug(device):
    probes = measure(registry.load("dropout_in_eval"), device, torch.float32).probes
    fixed, buggy = probes["two identical calls in eval"].split("; ")
    assert fixed == "fixed.py identical" and buggy.startswith("buggy.py differ by up to")
