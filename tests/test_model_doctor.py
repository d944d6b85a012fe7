"""The doctor on whole models: layers found by what they compute, probed as the model calls
them, and the model's own properties, each bug failing on the probe that names it."""

import json

import pytest
import torch

from harness import cli
from harness.doctor import diagnose_model
from harness.doctor.findings import FAIL, Finding
from harness.doctor.model.call import ModelCall, takes_token_ids
from harness.doctor.model.diagnosis import named_trap
from harness.doctor.model.layers import attention_layers
from harness.doctor.model.replay import Replay
from harness.doctor.target import Sizes, build
from tests import model_modules

TARGET = "tests/model_modules.py"


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def small(cls):
    return build(cls, Sizes(), 0)


def failing(diagnosis):
    """(where, probe) of every failure: a layer group's first path, or "model"."""
    found = [(g.paths[0], f.probe) for g in diagnosis.groups for f in g.diagnosis.findings
             if f.status == FAIL]  # fmt: skip
    return found + [("model", f.probe) for f in diagnosis.properties if f.status == FAIL]


def test_a_healthy_model_exits_0_with_its_layers_in_one_group(capsys):
    code, out, _ = run_cli(capsys, "doctor", f"{TARGET}:GPT")
    assert code == 0, out
    assert "h.0.attn (+1 like it)" in out and "causal (declared)" in out
    assert "PASS  causal no-leak" in out and out.rstrip().endswith("=> healthy")


@pytest.mark.parametrize(
    ("cls", "probe", "trap"),
    [
        ("LeakyGPT", "causal no-leak", "causal_leak"),
        ("TwiceScaledGPT", "agrees with SDPA", "double_scale"),
        ("BatchMixingGPT", "batch independence", ""),
    ],
)
def test_each_bug_fails_on_its_probe_with_the_layer_path(capsys, cls, probe, trap):
    code, out, _ = run_cli(capsys, "doctor", f"{TARGET}:{cls}", "--json")
    report = json.loads(out)
    assert code == 1
    (layer,) = report["layers"]
    assert layer["paths"] == ["h.0.attn", "h.1.attn"]
    failed = [f["probe"] for f in layer["findings"] if f["status"] == FAIL]
    assert probe in failed
    assert (layer["trap"] or "") == trap


def test_the_model_probes_name_a_leak_and_batch_mixing():
    leaky = diagnose_model(small(model_modules.LeakyGPT))
    assert ("model", "causal no-leak") in failing(leaky)
    mixing = diagnose_model(small(model_modules.BatchMixingGPT))
    assert ("model", "batch independence") in failing(mixing)
    healthy = diagnose_model(small(model_modules.GPT))
    assert failing(healthy) == []


def test_layers_are_found_by_what_they_compute():
    model = small(model_modules.HybridGPT).eval()
    found = [c.path for c in attention_layers(model, ModelCall.of(model))]
    # the recurrent block mixes positions and runs a router's softmax, but its mixing is a
    # recurrence: no attention layer
    assert found == ["h.0.attn", "h.1.attn"]


def test_a_model_is_told_apart_from_a_layer():
    assert takes_token_ids(small(model_modules.GPT))
    assert not takes_token_ids(small(model_modules.SelfAttention))


def test_the_users_model_is_left_as_it_was():
    model = small(model_modules.GPT).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    diagnose_model(model)
    assert model.training
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_forward_that_needs_more_than_ids_is_one_line(capsys):
    code, out, err = run_cli(capsys, "doctor", f"{TARGET}:ImageModel")
    assert code == 2 and not out
    assert err.count("\n") == 1 and "needs `pixel_values`" in err


def test_a_replayed_call_gives_the_models_own_layer_output():
    model = small(model_modules.GPT).eval().double()
    call = ModelCall.of(model)
    seen = {}
    model.h[1].attn.register_forward_hook(lambda m, a, out: seen.update(x=a[0], out=out))
    with torch.no_grad():
        call.run(model, call.tokens(2, 8, 0))
    replay = Replay(model, "h.1.attn", call)
    positions = torch.arange(8).expand(2, 8)
    with torch.no_grad():
        out = replay(model.h[1].attn, seen["x"], positions=positions, mask=None, cache=None)
    assert torch.equal(out, seen["out"])


def test_the_trap_named_is_the_one_the_evidence_names():
    findings = [Finding("a", "pass", "(causal_leak: fine)"),
                Finding("b", FAIL, "it behaves like the scale applied twice (1/d_k): double_scale"),
                Finding("c", FAIL, "(stale_cache: appended twice)")]  # fmt: skip
    assert named_trap(findings) == "double_scale"
    assert named_trap(findings[:1]) == ""  # none fails
    unnamed = [Finding("d", FAIL, "output of sequence 0 depends on sequence 1"), *findings]
    assert named_trap(unnamed) == ""  # the first failure names none


transformers = pytest.importorskip("transformers")


def test_a_transformers_model_is_healthy_on_every_probe_it_runs():
    diagnosis = diagnose_model(small(transformers.LlamaForCausalLM))
    assert diagnosis.healthy, diagnosis.text()
    ran = {f.probe for f in diagnosis.properties if f.status == "pass"}
    assert {"causal no-leak", "left padding", "cached generation", "backends agree"} <= ran


def test_sliding_and_global_layers_are_probed_apart():
    diagnosis = diagnose_model(small(transformers.Gemma2ForCausalLM))
    assert [g.paths for g in diagnosis.groups] == [["model.layers.0.self_attn"],
                                                   ["model.layers.1.self_attn"]]  # fmt: skip


@pytest.mark.parametrize(
    ("bug", "where", "probe", "trap"),
    [
        ("llama-causal-mask-dropped", "model", "causal no-leak", "causal_leak"),
        ("llama-positions-restart-under-cache", "model", "cached generation",
         "rope_cache_offset"),
        ("llama-kv-heads-tiled", "model", "backends agree", ""),
    ],
)  # fmt: skip
def test_injected_bugs_fail_on_the_probe_named(bug, where, probe, trap):
    from harness.zoo.bugs import BUGS

    (injected,) = [b for b in BUGS if b.id == bug]
    diagnosis = diagnose_model(injected.build())
    assert (where, probe) in failing(diagnosis)
    found = next(f for f in diagnosis.properties if f.probe == probe)
    assert trap in found.message
