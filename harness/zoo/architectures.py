"""Which architectures the zoo diagnoses and how each is built: every model type of the
installed transformers' causal-LM and masked-LM auto-mappings, built from its config class at
the doctor's tiny size (harness.doctor.target's size table: hidden 64, 4 heads, 2 layers, a
vocabulary of 256)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from torch import nn

from harness.doctor.target import Sizes, build

MAPPINGS = {
    "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "masked-lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
}


@dataclass(frozen=True)
class Architecture:
    """One model type, as one of its auto-mappings names its class."""

    model_type: str
    task: str  # causal-lm | masked-lm
    class_name: str

    @property
    def id(self) -> str:
        return f"{self.model_type}-{self.task}"

    def build(self, seed: int = 0, layers: int = 2, **init: object) -> nn.Module:
        """The model at the doctor's tiny size, under ``seed``, with config fields ``init``; a
        causal LM built as a decoder (``is_decoder``, XLM's ``causal``), as transformers' own
        tests build the encoder families' causal-LM classes (built without it they attend both
        ways)."""
        transformers = importlib.import_module("transformers")
        if self.task == "causal-lm":
            init = {"is_decoder": True, "causal": True, **init}
        sizes = Sizes(init=init, layers=layers)
        return build(getattr(transformers, self.class_name), sizes, seed)


def architectures() -> list[Architecture]:
    """Every model type of the two auto-mappings, in the mappings' order."""
    auto = importlib.import_module("transformers.models.auto.modeling_auto")
    found = []
    for task, mapping in MAPPINGS.items():
        for model_type, class_name in getattr(auto, mapping).items():
            if isinstance(class_name, tuple | list):  # several classes: the first
                class_name = class_name[0]
            found.append(Architecture(model_type, task, class_name))
    return found
