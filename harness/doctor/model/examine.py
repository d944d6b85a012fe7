"""Diagnose a whole model: find its attention layers, probe the first of each group as the
model calls it, then probe the model's own properties."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import replace

from torch import nn

from harness.doctor.examine import diagnose, evidence
from harness.doctor.findings import FAIL, Finding, Outcome, failed
from harness.doctor.guard import TIMEOUT, guarded
from harness.doctor.model import backends, generation, properties
from harness.doctor.model.call import ModelCall
from harness.doctor.model.diagnosis import LayerGroup, ModelDiagnosis
from harness.doctor.model.layers import attention_layers, grouped
from harness.doctor.model.patient import Patient, declared_causal
from harness.doctor.model.replay import Replay
from harness.doctor.subject import Config, quietly_seeded
from harness.errors import UsageError

MODEL_PROBES: dict[str, Callable[[Patient], Outcome]] = {
    "causal no-leak": properties.causal_no_leak,
    "batch independence": properties.batch_independence,
    "left padding": properties.left_padding,
    "cached generation": generation.cached_generation,
    "cache reuse": generation.cache_reuse,
    "backends agree": backends.backends,
    "low precision": backends.low_precision,
}
FINDING = "finding attention layers"


def layer_config(config: Config, call: ModelCall, causal: bool, replay: Replay) -> Config:
    """The layer probes' options: masks go to the model as its attention mask (a key padding
    mask, 1 for a real token), calls through the model's recorded call."""
    mask = {"mask": "keep", "mask_shape": "bk", "mask_dtype": "float"} if call.mask else {
        "mask": "none"}  # fmt: skip
    return replace(config, call=replay, causal=config.causal or causal, **mask)


def diagnose_model(
    model: nn.Module,
    config: Config | None = None,
    target: str = "",
    timeout: float | None = TIMEOUT,
    progress: Callable[[str], None] | None = None,
    crashed: Mapping[str, str] | None = None,
) -> ModelDiagnosis:
    """Probe ``model`` (left as it was): every group of attention layers, then the model."""
    report = progress or (lambda step: None)
    config = config or Config()
    if config.call is not None:
        raise UsageError("a model is its own adapter: --call is for a lone layer")
    found = ModelDiagnosis(target or type(model).__name__, type(model).__name__, config.strict)
    call = ModelCall.of(model)
    model = copy.deepcopy(model).eval()  # the user's model keeps its mode and its weights
    report(FINDING)
    try:
        with guarded(timeout), quietly_seeded(config.seed):
            groups = grouped(attention_layers(model, call, config.seed))
            said = True if config.causal else declared_causal(model, [g.module for g in groups])
            patient = Patient.of(model, call, bool(said), config.seed)
            if said is None:  # measured: earlier logits ignore later tokens
                patient.causal = properties.masks_future(patient)
            causal = patient.causal
    except UsageError:
        raise
    except Exception as exc:
        found.properties.append(Finding(FINDING, FAIL, evidence(exc)))
        return found
    how = "measured: earlier logits ignore later tokens" if said is None else "declared"
    found.notes.append(
        f"{'causal' if causal else 'not causal'} ({how}); model probes in "
        f"{str(patient.dtype).removeprefix('torch.')}, {len(groups)} layer group(s)"
    )
    if not groups:  # a recurrence or a convolution: the model's own probes still apply
        found.notes.append("no attention layer: no submodule mixes positions with a softmax")
    for group in groups:
        replay = Replay(model, group.path, call, config.seed)
        layer = layer_config(config, call, causal, replay)
        diagnosis = diagnose(group.module, layer, group.path, timeout,
                             progress=lambda step, p=group.path: report(f"{p}: {step}"),
                             crashed=_prefixed(crashed, group.path))  # fmt: skip
        found.groups.append(LayerGroup(group.paths, group.cls, diagnosis))
    for name, probe in MODEL_PROBES.items():
        report(name)
        if crashed and name in crashed:
            found.properties.append(Finding(name, FAIL, crashed[name]))
            continue
        found.properties.append(_examine(name, probe, patient, timeout))
    return found


def _prefixed(crashed: Mapping[str, str] | None, path: str) -> dict[str, str]:
    """The crashed layer probes of one layer, by probe name."""
    prefix = f"{path}: "
    return {k.removeprefix(prefix): v for k, v in (crashed or {}).items() if k.startswith(prefix)}


def _examine(name: str, probe: Callable[[Patient], Outcome], patient: Patient,
             timeout: float | None) -> Finding:  # fmt: skip
    try:
        with guarded(timeout), quietly_seeded(patient.seed):
            outcome = probe(patient)
    except UsageError:
        raise
    except Exception as exc:
        outcome = failed(evidence(exc))
    return Finding(name, outcome.status, outcome.message)
