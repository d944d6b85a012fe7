"""Diagnose a whole model: find its attention layers, probe the first of each group as the
model calls it, then probe the model's own properties."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import replace

import torch
from torch import nn

from harness.doctor.config import Config, quietly_seeded
from harness.doctor.examine import SETUP, diagnose, evidence
from harness.doctor.findings import FAIL, PASS, SKIP, WARN, Diagnosis, Finding, Outcome, failed
from harness.doctor.guard import TIMEOUT, guarded
from harness.doctor.model import backends, generation, properties
from harness.doctor.model.call import BATCH, SEQ_LEN, ModelCall, state_of
from harness.doctor.model.diagnosis import LayerGroup, ModelDiagnosis
from harness.doctor.model.layers import Group, attention_layers, grouped
from harness.doctor.model.patient import Patient, declared_causal, layer_causal
from harness.doctor.model.replay import Replay
from harness.doctor.named import IDENTIFIES
from harness.doctor.probes.scale import unscaled_by_design
from harness.doctor.reading.checks import NAME as READ
from harness.errors import UsageError
from harness.reference import HEAD_DIM_ATTRS, int_attribute

DETERMINISM = "eval determinism"
MODEL_PROBES: dict[str, Callable[[Patient], Outcome]] = {
    DETERMINISM: properties.eval_determinism,
    "causal no-leak": properties.causal_no_leak,
    "batch independence": properties.batch_independence,
    "left padding": properties.left_padding,
    "cached generation": generation.cached_generation,
    "cache reuse": generation.cache_reuse,
    "backends agree": backends.backends,
    "low precision": backends.low_precision,
}
FINDING = "finding attention layers"


def declared_scale(layer: nn.Module) -> float | None:
    """The factor a layer says it puts on its scores (transformers' ``scaling``: Granite's
    ``attention_multiplier``, Gemma's ``query_pre_attn_scalar ** -0.5``), None when it says
    nothing: then 1/sqrt(head width), as SDPA's."""
    value = getattr(layer, "scaling", None)
    if not (isinstance(value, float) and 0 < value < float("inf")):
        return None
    width = int_attribute(layer, HEAD_DIM_ATTRS)
    usual = width is not None and math.isclose(value * math.sqrt(width), 1.0, rel_tol=1e-6)
    return None if usual else value  # 1/sqrt(d) is what the probes assume anyway


def layer_plan(
    config: Config, group: Group, causal: bool, replay: Replay
) -> tuple[Config, dict[str, str]]:
    """The layer probes' options, and the probes not run with the reason each reports.

    Masks go to the model as its attention mask (a key padding mask, 1 for a real token) where
    that mask reaches the layer; calls go through the model's recorded call. Causal when it
    masks the future as its model calls it (a decoder's self-attention, whatever its flags
    say), else as the layer says (an encoder's layers are not), else as the model. A layer
    whose positions come from its model as a score bias, or from a convolution of its own, is
    not held to permutation equivariance or token order, which its model shows or not; one
    with a position bias is not compared with SDPA, which would not add it.
    """
    padded = replay.padding_reaches_layer()
    mask = {"mask": "keep", "mask_shape": "bk", "mask_dtype": "float"} if padded else {
        "mask": "none"}  # fmt: skip
    said = layer_causal(group.module)
    masks = group.call is not None and group.call.masks_future()  # what it does, as called
    said = masks or (causal if said is None else said)
    positions = replay.position_inputs()
    conv = any(isinstance(m, nn.modules.conv._ConvNd) for m in group.module.modules())
    skip: dict[str, str] = {}
    if positions == "bias" or conv:
        how = "a position bias its model adds" if positions == "bias" else "its own convolution"
        reason = (f"positions reach it through {how}: whether tokens' order counts is the "
                  "model's to show")  # fmt: skip
        skip.update(dict.fromkeys(("permutation equivariance", "token order"), reason))
    # a position bias its model adds: SDPA would not add it, so the layer's scale is measured
    # from its weights instead (softmax(s q k^T + B), B the same for every input)
    biased = positions == "bias"
    positions = "absolute" if biased and config.positions == "auto" else config.positions
    return replace(config, call=replay, causal=config.causal or said, positions=positions,
                   **mask), skip  # fmt: skip


def probe_layer(
    config: Config, group: Group, causal: bool, replay: Replay, timeout: float | None,
    report: Callable[[str], None], crashed: Mapping[str, str] | None,
) -> Diagnosis:  # fmt: skip
    """The layer probes on the first layer of ``group``, as its model calls it; a layer that
    declares a scale (``scaling``) and does not agree with SDPA at 1/sqrt(d) is probed again at
    its declared one (Granite's ``attention_multiplier``), kept when SDPA agrees there, or when
    the comparison could not be made at 1/sqrt(d) (a rotary SDPA does not reproduce): then the
    declared scale's comparison decides (Gemma2's softcap put after the mask is named only at
    its own scale), else the layer's word, and its low-precision floor is that of its own
    scale. ESM scales its queries itself and declares 1: SDPA agrees at 1/sqrt(d), and that
    stays. What the forward computed outranks what the layer alone states: a scale the recorded
    forward shows wrong (``read from the forward``), where SDPA could compare at neither scale,
    is not excused by a ``scaling`` attribute that says the same wrong number (fair-esm's
    ``self.scaling`` set to 1), unless its model's config states that number too (Granite's
    ``attention_multiplier``): a design then, not a slip. Nor is a stated scale that the
    comparison at 1/sqrt(d) fits as 1/sqrt(d_model), the catalogue's slip, unconfigured."""
    with guarded(timeout), quietly_seeded(config.seed):
        layer, skip = layer_plan(config, group, causal, replay)

    def run(options: Config) -> Diagnosis:
        return diagnose(group.module, options, group.path, timeout,
                        progress=lambda step: report(f"{group.path}: {step}"),
                        crashed=_prefixed(crashed, group.path), skip=skip)  # fmt: skip

    diagnosis = run(layer)
    declared = declared_scale(group.module)
    if declared is None or layer.scale is not None or _sdpa(diagnosis) in (PASS, WARN):
        return diagnosis
    other = run(replace(layer, scale=declared))
    if _sdpa(other) in (PASS, WARN):
        fitted = next(f.traps for f in diagnosis.findings if f.probe == "agrees with SDPA")
        if "scale_d_model" in fitted and not _configured(replay.model, declared):
            return diagnosis  # its word is the catalogue's slip, 1/sqrt(d_model), unconfigured
        return other
    if _sdpa(diagnosis) != SKIP:
        return diagnosis  # compared at 1/sqrt(d), and not agreeing at its word either
    read = any(f.probe == READ and f.status == FAIL for f in diagnosis.findings)
    if read and _sdpa(other) == SKIP and not _configured(replay.model, declared):
        return diagnosis  # nothing measured backs its word, and the forward shows it wrong
    return other


def _configured(model: nn.Module, scale: float) -> bool:
    """The model's config states ``scale``: one of its float settings is that factor, or the
    number whose inverse square root it is (Gemma's ``query_pre_attn_scalar``)."""
    config = getattr(model, "config", None)
    settings = vars(config) if hasattr(config, "__dict__") else {}
    numbers = [v for v in settings.values() if isinstance(v, float) and v > 0]
    return any(math.isclose(scale, v, rel_tol=1e-6) or math.isclose(scale, v**-0.5, rel_tol=1e-6)
               for v in numbers)  # fmt: skip


def _sdpa(diagnosis: Diagnosis) -> str:
    """The status of the layer's comparison with SDPA (skip when it was not made)."""
    return next((f.status for f in diagnosis.findings if f.probe == IDENTIFIES), SKIP)


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
    modes = {m: m.training for m in model.modules()}
    try:  # in eval mode, as its copy: a lambda attribute (minGPT's mlpf) calls the original
        model.eval()
        return _diagnose_model(model, config, target, timeout, report, crashed)
    finally:
        for m, training in modes.items():  # the user's model keeps its mode and its weights
            m.training = training


def _diagnose_model(
    model: nn.Module, config: Config, target: str, timeout: float | None,
    report: Callable[[str], None], crashed: Mapping[str, str] | None,
) -> ModelDiagnosis:  # fmt: skip
    found = ModelDiagnosis(target or type(model).__name__, type(model).__name__, config.strict)
    call = ModelCall.of(model)
    model = copy.deepcopy(model).eval()
    built = state_of(model)  # a cache it keeps inside, before the forwards below fill it
    runs(model, call, config.seed, timeout)
    report(FINDING)
    try:
        with guarded(timeout), quietly_seeded(config.seed):
            groups = grouped(attention_layers(model, call, config.seed))
            said = (True, "--causal") if config.causal else declared_causal(model, groups, call)
            patient = Patient.of(model, call, bool(said and said[0]), config.seed, built)
            patient.attends = bool(groups)
            if said is None:  # measured: earlier logits ignore later tokens
                patient.causal = properties.masks_future(patient)
            causal = patient.causal
    except UsageError:
        raise
    except Exception as exc:
        found.properties.append(Finding.of(FINDING, failed(evidence(exc))))
        return found
    how = f"declared: {said[1]}" if said is not None else (
        "measured: earlier logits ignore later tokens" if causal
        else "measured: later tokens reach earlier logits")  # fmt: skip
    found.notes.append(
        f"{'causal' if causal else 'not causal'} ({how}); model probes in "
        f"{str(patient.dtype).removeprefix('torch.')}, {len(groups)} layer group(s)"
    )
    if not groups:  # a recurrence or a convolution: the model's own probes still apply
        nothing = "no attention layer found: no submodule mixes positions with a softmax"
        found.properties.append(Finding(FINDING, WARN, f"{nothing}, so no layer was probed"))
    # T5 keeps its relative_attention_bias in its first layer and hands later layers of the
    # same class the bias it computed: they are unscaled by the same design
    unscaled = {type(g.module): g.path for g in groups if unscaled_by_design(g.module)}
    for group in groups:
        replay = Replay(model, group.path, call, config.seed)
        replay.sequence_first = group.call.slot.sequence_first if group.call else None
        layer_config = config
        first = unscaled.get(type(group.module))
        if first not in (None, group.path) and config.scale is None:
            layer_config = replace(config, scale=1.0)
            found.notes.append(f"{group.path} held to scale 1, as {first} of its class, which "
                               "holds T5's relative_attention_bias")  # fmt: skip
        try:
            diagnosis = probe_layer(layer_config, group, causal, replay, timeout, report, crashed)
        except UsageError:
            raise
        except Exception as exc:  # the model cannot be run to record this layer's calls
            diagnosis = Diagnosis(group.path, config, [Finding.of(SETUP, failed(evidence(exc)))])
        found.groups.append(LayerGroup(group.paths, group.cls, diagnosis))
    for name, probe in MODEL_PROBES.items():
        report(name)
        if crashed and name in crashed:
            found.properties.append(Finding(name, FAIL, crashed[name]))
            continue
        if any(f.probe == DETERMINISM and f.status == FAIL for f in found.properties):
            found.properties.append(Finding(name, SKIP, "two identical forwards differ (see "
                                            f"{DETERMINISM}): nothing else compares"))  # fmt: skip
            continue
        found.properties.append(_examine(name, probe, patient, timeout))
    return found


def runs(model: nn.Module, call: ModelCall, seed: int, timeout: float | None) -> None:
    """The model's forward runs on token ids; else a UsageError saying how it fails (a model
    that needs a language set, an input it cannot make from ids)."""
    ids = call.tokens(BATCH, SEQ_LEN, seed)
    try:
        with guarded(timeout), quietly_seeded(seed), torch.no_grad():
            call.run(model, ids)
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(
            f"{type(model).__name__}.forward raises on token ids (B={BATCH}, T={SEQ_LEN}): "
            f"{evidence(exc).text}"
        ) from None


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
    return Finding.of(name, outcome)
