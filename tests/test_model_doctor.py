"""The doctor on whole models: layers found by what they compute, probed as the model calls
them, and the model's own properties, each bug failing on the probe that names it."""

import json
import re
from types import SimpleNamespace

import pytest
import torch

from harness import cli
from harness.doctor import Config, diagnose, diagnose_model
from harness.doctor.findings import FAIL, Finding, failed, named, passed
from harness.doctor.model.call import ModelCall, takes_token_ids
from harness.doctor.model.diagnosis import first_trap
from harness.doctor.model.layers import attention_layers
from harness.doctor.model.replay import Replay, _rotary_table
from harness.doctor.named import named_trap
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


def _layer(diagnosis, probe):
    (group,) = diagnosis.groups
    return next(f for f in group.diagnosis.findings if f.probe == probe)


def _model(diagnosis, probe):
    return next(f for f in diagnosis.properties if f.probe == probe)


def test_a_healthy_model_exits_0_with_its_layers_in_one_group(capsys):
    code, out, _ = run_cli(capsys, "doctor", f"{TARGET}:GPT")
    assert code == 0, out
    assert "h.0.attn (+1 like it)" in out and "causal (declared: " in out
    assert "PASS  causal no-leak" in out and out.rstrip().endswith("=> healthy")


@pytest.mark.parametrize(
    ("cls", "probe", "trap"),
    [
        ("LeakyGPT", "causal no-leak", "causal_leak"),
        ("TwiceScaledGPT", "agrees with SDPA", "double_scale"),
        ("BatchMixingGPT", "batch independence", "head_merge_no_transpose"),  # read: cut up
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


def test_the_trap_named_is_the_one_the_evidence_carries():
    findings = [Finding("a", "pass", "fine", ("causal_leak",)),
                Finding("b", FAIL, "the scale applied twice", ("double_scale",)),
                Finding("c", FAIL, "appended twice", ("stale_cache",))]  # fmt: skip
    assert named_trap(findings) == "double_scale"
    assert named_trap(findings[:1]) == ""  # none fails
    unnamed = [Finding("d", FAIL, "output of sequence 0 depends on sequence 1"), *findings]
    assert named_trap(unnamed) == ""  # the first failure names none
    window = Finding("sliding window", FAIL, "0..4, not 1..4", ("sliding_window_off_by_one",))
    unnamed_sdpa = Finding("agrees with SDPA", FAIL, "no known trap's arithmetic comes near it")
    assert named_trap([unnamed_sdpa, window]) == "sliding_window_off_by_one"
    sdpa = Finding("agrees with SDPA", FAIL, "softmax over the queries", ("softmax_dim",))
    leak = Finding("causal no-leak", FAIL, "position 0 depends on input 1", ("causal_leak",))
    assert named_trap([leak, sdpa]) == "softmax_dim"  # the cause, not its consequence
    assert named_trap([leak, Finding("agrees with SDPA", FAIL, "off by 0.3")]) == "causal_leak"
    either = Finding("b", FAIL, "read the other way round", ("mask_bool", "sdpa_mask_inverted"))
    assert named_trap([either]) == "mask_bool or sdpa_mask_inverted"  # both, undecided
    words = Finding("agrees with SDPA", FAIL, "it behaves like ...: double_scale")
    assert named_trap([words]) == ""  # a name in the words alone is not read back


def test_evidence_joined_keeps_the_traps_it_names():
    said = "weight 0.5 on a masked key" + named(", a later one (causal_leak)", "causal_leak")
    outcome = failed(said + "; more", "softmax_dim")
    assert outcome.message == "weight 0.5 on a masked key, a later one (causal_leak); more"
    assert outcome.traps == ("causal_leak", "softmax_dim")
    assert failed("plain").traps == () and passed(said).traps == ()


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
    found = _model(diagnosis, probe)
    assert trap in found.message


def test_an_injected_bug_is_caught_only_where_its_trap_is_named():
    """Gemma 2 capping after the mask at a scale that is not 1/sqrt(d): SDPA at 1/sqrt(d)
    cannot reproduce its rotary layers, so the comparison at its declared scale names the cap
    put after the mask; a zoo row that expects another trap there is not caught."""
    from harness.zoo.bugs import BUGS
    from harness.zoo.rows import diagnose_row

    (bug,) = [b for b in BUGS if b.id == "gemma2-small-cap-softcap-after-mask"]
    row = diagnose_row(bug.id, bug.class_name, bug.build, expect=bug.probe, trap=bug.trap)
    assert row.caught, row.evidence
    other = diagnose_row(bug.id, bug.class_name, bug.build, expect=bug.probe, trap="double_scale")
    assert other.ran and not other.caught, other.evidence


def test_a_bug_form_matched_with_another_rotary_pairing_than_sdpas_nearest_says_which():
    """Llama pairs i with i + d/2 (rotate_half); under the doubled scale SDPA's nearest is the
    other pairing, so the match names the pairing it was made with."""
    from harness.zoo.bugs import BUGS

    (bug,) = [b for b in BUGS if b.id == "llama-scale-twice"]
    found = _layer(diagnose_model(bug.build()), "agrees with SDPA").message
    assert "RoPE (pairs)" in found and "(1/d_k) with RoPE (half) (within" in found, found


def test_an_unnamed_symptom_gives_way_to_the_next_failure_that_names_a_trap():
    symptom = Finding("attention weights", FAIL, "weight 0.13 on a masked key")
    cause = Finding("padding no-leak", FAIL, "reaches the queries", ("padding_on_queries",))
    assert named_trap([symptom, cause]) == "padding_on_queries"
    unnamed = Finding("causal no-leak", FAIL, "output 0 depends on input 7")
    assert named_trap([unnamed, cause]) == ""  # a later name may be a consequence


def test_attention_sinks_are_not_a_broken_softmax():
    diagnosis = diagnose_model(small(model_modules.SinkGPT))
    assert diagnosis.healthy, diagnosis.text()
    assert "attention sinks (`sinks`" in _layer(diagnosis, "agrees with SDPA").message


def test_a_layer_is_held_to_the_scale_it_declares():
    declared = diagnose_model(small(model_modules.DeclaredUnscaledGPT))
    assert declared.healthy, declared.text()
    silent = diagnose_model(small(model_modules.SilentUnscaledGPT))
    assert "missing_scale" in _layer(silent, "agrees with SDPA").message


def test_a_scale_a_layer_states_is_not_its_design_where_it_is_1_over_sqrt_d_model():
    """A ``scaling`` of 1/sqrt(model width) is the catalogue's slip, named, unless the model's
    config states that number (then it is a design, as Granite's multiplier is)."""
    stated = diagnose_model(small(model_modules.ModelWidthScaledGPT))
    assert not stated.healthy, stated.text()
    assert "scale_d_model" in _layer(stated, "agrees with SDPA").traps
    configured = small(model_modules.ModelWidthScaledGPT)
    configured.config = SimpleNamespace(attention_multiplier=configured.h[0].attn.scaling)
    assert diagnose_model(configured).healthy


def test_a_layer_after_a_float32_only_block_is_recorded_in_float32():
    diagnosis = diagnose_model(small(model_modules.Float32OnlyGPT))
    assert diagnosis.healthy, diagnosis.text()
    assert diagnosis.groups[0].paths == ["h.0.attn", "h.1.attn"]


def test_a_forward_that_raises_on_ids_is_one_line(capsys):
    code, out, err = run_cli(capsys, "doctor", f"{TARGET}:NeedsLanguage")
    assert code == 2 and not out
    assert err.count("\n") == 1 and "NeedsLanguage.forward raises on token ids" in err


def test_the_zoo_table_counts_what_it_shows():
    from harness.zoo.rows import Row
    from harness.zoo.table import summary, verdict

    rows = [Row("a-causal-lm", "A", built=True, ran=True, healthy=True, layers=2),
            Row("b-causal-lm", "B", built=True, ran=True, known="defect: x"),
            Row("c-causal-lm", "C", built=True),
            Row("d-masked-lm", "D"),
            Row("bug", "A", built=True, ran=True, expected="causal no-leak", caught=True),
            Row("bug2", "A", built=True, ran=True, expected="left padding")]  # fmt: skip
    assert [verdict(r) for r in rows] == ["healthy", "known defect", "-", "-", "caught", "MISSED"]
    text = summary(rows)
    assert "4 architectures; 3 build" in text and "2 of them run" in text and "(66.7%)" in text
    assert "unhealthy: 1, of which 1" in text and "naming the trap: 1 of 2" in text


def test_an_encoder_decoder_is_probed_layer_by_layer():
    diagnosis = diagnose_model(small(transformers.BartForConditionalGeneration))
    assert diagnosis.healthy, diagnosis.text()
    encoder, decoder = diagnosis.groups
    assert (encoder.diagnosis.config.causal, decoder.diagnosis.config.causal) == (False, True)
    # the encoder's padding reaches the decoder's self-attention only through cross-attention
    assert (encoder.diagnosis.config.mask, decoder.diagnosis.config.mask) == ("keep", "none")


def test_a_cache_the_model_passes_its_layers_is_copied_for_each_replay():
    diagnosis = diagnose_model(small(transformers.XLMWithLMHeadModel))
    assert [len(g.paths) for g in diagnosis.groups] == [2], diagnosis.text()
    # each replay starts from the cache as the model passed it, not as the last replay left it
    assert diagnosis.groups[0].diagnosis.healthy, diagnosis.text()


def test_left_padding_compares_positions_passed_the_same_way():
    diagnosis = diagnose_model(small(transformers.CamembertForMaskedLM))
    padding = _model(diagnosis, "left padding")
    assert padding.status == "pass", padding.message


def test_a_zoo_case_past_its_limit_is_a_row_that_says_so():
    import time

    from harness.zoo.rows import diagnose_row

    def slow(layers=2):
        time.sleep(5)

    row = diagnose_row("slow-causal-lm", "Slow", slow, limit=0.5)
    assert (row.built, row.ran) == (False, False)
    assert row.evidence.startswith("did not finish within 0.5 s")
    built = diagnose_row("gpt-causal-lm", "GPT", lambda layers=2: small(model_modules.GPT))
    assert (built.built, built.ran, built.healthy, built.layers) == (True, True, True, 2)


def test_gradient_flow_asks_how_the_model_uses_a_weight_the_output_misses():
    apart = _layer(diagnose_model(small(model_modules.ApartBiasGPT)), "gradient flow")
    assert apart.status == "pass" and "dense_bias: no gradient through the layer's output" in (
        apart.message
    )
    idle = _layer(diagnose_model(small(model_modules.IdleWeightGPT)), "gradient flow")
    assert idle.status == "warn" and "unused by the model as called" in idle.message
    assert "entity_query.weight" in idle.message


def test_a_hybrid_without_attention_at_two_layers_is_built_deeper():
    from types import SimpleNamespace

    from harness.zoo.rows import DEEPER, diagnose_row

    def make(layers=2):
        model = small(model_modules.HybridGPT if layers == DEEPER else model_modules.GPT)
        if layers != DEEPER:
            model.h = torch.nn.ModuleList([model_modules.RecurrentBlock(model.config)])
        model.config = SimpleNamespace(**vars(model.config), layer_types=["linear"] * layers)
        return model

    row = diagnose_row("hybrid-causal-lm", "Hybrid", make)
    assert (row.ran, row.layers) == (True, 2), row


def test_a_fixed_length_decoders_logits_are_read_for_the_input_only():
    diagnosis = diagnose_model(small(model_modules.FixedLengthLM))
    assert diagnosis.healthy, diagnosis.text()


@pytest.mark.parametrize("cls", ["StartPosGPT", "InputPosGPT"])
def test_a_model_that_keeps_its_cache_inside_is_decoded_through_it(cls):
    healthy = diagnose_model(small(getattr(model_modules, cls)))
    assert healthy.healthy, healthy.text()
    decoded = _model(healthy, "cached generation")
    assert decoded.status == "pass" and "one token per step: 0" in decoded.message
    buggy = diagnose_model(small(getattr(model_modules, f"FrontSlots{cls}")))
    assert failing(buggy) == [("model", "cached generation")]


def test_a_rolling_cache_is_decoded_past_its_wrap_around():
    """A prompt of 5 wraps a 4-slot rolling cache: written in order instead of at p % 4, the
    next tokens lose a key of their window, which prompts of 4 never show."""
    healthy = diagnose_model(small(model_modules.RollingStartPosGPT))
    assert healthy.healthy, healthy.text()
    buggy = diagnose_model(small(model_modules.InOrderRollingStartPosGPT))
    assert failing(buggy) == [("model", "cached generation")], buggy.text()
    found = _model(buggy, "cached generation")
    assert "long prefill differs" in found.message and "prompts of 4 agree" in found.message
    assert named_trap([found]) == "stale_cache", found.message


def test_positions_that_index_a_rolling_cache_are_not_shifted_for_a_layer():
    """Mistral's reference ``forward(input_ids, positions)``: the forward changes its cache, so
    shifted positions would read slots no token wrote; the layer is not asked for them."""
    diagnosis = diagnose_model(small(model_modules.RollingPositionsGPT))
    assert diagnosis.healthy, diagnosis.text()
    shift = next(f for f in diagnosis.groups[0].diagnosis.findings if f.probe == "position shift")
    assert shift.status == "skip" and "index a cache the model keeps" in shift.message, shift


def test_a_cache_length_that_is_a_property_is_left_to_setup_caches():
    """litgpt's max_seq_length setter rebuilds its rope cache: never set to -1 to force a
    larger cache, as gpt-fast's plain attribute is."""
    diagnosis = diagnose_model(small(model_modules.PropertyLengthInputPosGPT))
    assert diagnosis.healthy, diagnosis.text()


def test_later_layers_handed_t5s_bias_are_unscaled_as_the_first():
    diagnosis = diagnose_model(small(model_modules.SharedBucketGPT))
    assert diagnosis.healthy, diagnosis.text()
    assert any("h.1.attn held to scale 1, as h.0.attn" in n for n in diagnosis.notes)


def test_gpt_fasts_real_frequency_table_is_a_rotary_table():
    angles = torch.outer(torch.arange(8.0), torch.tensor([1.0, 0.1, 0.01, 0.001]))  # (T, d/2)
    table = torch.stack([angles.cos(), angles.sin()], dim=-1)  # (T, d/2, 2), as gpt-fast's
    assert _rotary_table(table) == 8
    assert _rotary_table(torch.randn(8, 4, 2)) is None  # two numbers per pair, not on a circle


def test_a_layer_given_its_input_as_query_key_and_value_gets_x_in_all_three():
    # CTRL calls attn(x, x, x, mask, ...): the probes' hidden states must reach k and v too
    diagnosis = diagnose_model(small(transformers.CTRLLMHeadModel))
    assert diagnosis.healthy, diagnosis.text()
    # k and v are the probes' x, not a position bias its model adds: SDPA is compared
    assert _layer(diagnosis, "agrees with SDPA").status == "pass"


def test_a_composite_config_is_built_at_the_tiny_size_in_every_part():
    model = small(transformers.GotOcr2ForConditionalGeneration)  # 560M parameters as built
    assert sum(p.numel() for p in model.parameters()) < 5_000_000
    assert model.config.vision_config.hidden_size == 64


def test_a_hybrid_with_no_attention_at_any_depth_gets_one_in_its_last_layer():
    from types import SimpleNamespace

    from harness.zoo.rows import with_attention

    linear = ["linear_attention", "linear_attention"]
    indexed = SimpleNamespace(layer_types=linear, attn_layer_indices=None)
    assert with_attention(indexed) == {"attn_layer_indices": [1]}
    listed = SimpleNamespace(layer_types=linear)
    assert with_attention(listed) == {"layer_types": ["linear_attention", "full_attention"]}
    assert with_attention(SimpleNamespace(layer_types=["linear_attention", "attention"])) == {}


def test_a_rotary_dim_its_rotary_never_reads_is_not_held_against_it():
    # MiniMax-M3 keeps rotary_dim in its config (half a head here); its rotary reads
    # rope_parameters, which say the whole head
    from harness.zoo.architectures import architectures

    (arch,) = [a for a in architectures() if a.id == "minimax_m3_vl_text-causal-lm"]
    diagnosis = diagnose_model(arch.build())
    assert diagnosis.healthy, diagnosis.text()


def test_a_declared_scale_is_taken_where_sdpa_cannot_be_compared():
    # Gemma 4 scores RMS-normed q and k at scale 1 and normalizes v; its global layer's
    # proportional rotary is not one SDPA reproduces, so its word decides its floor
    diagnosis = diagnose_model(small(transformers.Gemma4ForCausalLM))
    local, global_ = (g.diagnosis for g in diagnosis.groups)
    sdpa = next(f for f in local.findings if f.probe == "agrees with SDPA")
    assert sdpa.status == "pass" and "v_norm" in sdpa.message and "scale 1," in sdpa.message
    assert global_.config.scale == 1.0
    half = [f for f in global_.findings if f.probe.endswith("robustness")]
    assert [f.status for f in half] == ["pass", "pass"], [f.message for f in half]


def test_a_sliding_window_shorter_than_the_padding_is_judged_on_rows_with_a_key():
    # right padding leaves some queries a window of padding only: eager spreads them evenly
    model = build(transformers.Gemma2ForCausalLM, Sizes(init={"sliding_window": 4}), 0)
    diagnosis = diagnose_model(model)
    assert diagnosis.healthy, diagnosis.text()
    (local, _) = (g.diagnosis for g in diagnosis.groups)
    assert next(f for f in local.findings if f.probe == "sliding window").status == "pass"
    # and its low-precision floor too: textbook attention's NaN there is no infinite floor
    for found in (f for f in local.findings if f.probe.endswith("robustness")):
        limit = re.search(r"within (\S+) \(2x rule\)", found.message)
        assert limit and float(limit[1]) < 0.1, found.message


def test_a_model_without_generate_is_causal_by_its_registered_mask():
    diagnosis = diagnose_model(small(model_modules.LeakyNoGenerateGPT))
    assert ("model", "causal no-leak") in failing(diagnosis), diagnosis.text()


def test_a_mask_buffer_one_diagonal_off_still_says_the_model_is_causal():
    diagnosis = diagnose_model(small(model_modules.OffByOneNoGenerateGPT))
    found = _model(diagnosis, "causal no-leak")
    assert found.status == FAIL, diagnosis.text()
    assert named_trap(diagnosis.groups[0].diagnosis.findings) == "causal_leak", diagnosis.text()


def test_a_forward_that_reads_what_the_last_one_left_is_stale_state_not_dropout():
    diagnosis = diagnose_model(small(model_modules.StaleReadStartPosGPT))
    found = _model(diagnosis, "eval determinism")
    assert found.status == FAIL and "stale_cache" in found.message, found.message
    dropout = diagnose_model(small(model_modules.LeakyGPT))  # deterministic: passes
    assert _model(dropout, "eval determinism").status == "pass"


def test_a_wrapper_whose_forward_takes_x_and_a_bool_mask_is_diagnosed_as_a_model():
    # x-transformers: forward(x, mask=...) with x the token ids and mask booleans
    x_transformers = pytest.importorskip("x_transformers")
    torch.manual_seed(0)
    model = x_transformers.TransformerWrapper(
        num_tokens=256, max_seq_len=64,
        attn_layers=x_transformers.Decoder(dim=64, depth=2, heads=4, rotary_pos_emb=True),
    )  # fmt: skip
    assert takes_token_ids(model)
    diagnosis = diagnose_model(model)
    assert diagnosis.healthy, diagnosis.text()
    padding = _model(diagnosis, "left padding")
    assert padding.status in ("pass", "warn"), padding.message


def test_torch_multihead_attention_is_found_and_a_keyless_row_is_named():
    healthy = diagnose_model(small(model_modules.MHAGPT))
    assert healthy.healthy and healthy.groups, healthy.text()
    assert healthy.groups[0].paths == ["h.0.mha", "h.1.mha"]
    keyless = diagnose_model(small(model_modules.DiagonalBlockedMHAGPT))
    found = _model(keyless, "eval determinism")
    assert found.status == FAIL and "fully_masked_row" in found.message, found.message


def test_cos_and_sin_passed_apart_are_rotary_tables_not_a_position_bias():
    diagnosis = diagnose_model(small(model_modules.SplitRotaryGPT))
    assert diagnosis.healthy, diagnosis.text()
    sdpa = _layer(diagnosis, "agrees with SDPA")
    assert sdpa.status == "pass" and "RoPE" in sdpa.message, sdpa.message


def test_a_cache_the_caller_makes_is_made_from_the_class_the_models_file_defines():
    healthy = diagnose_model(small(model_modules.PassedCacheGPT))
    assert healthy.healthy, healthy.text()
    decoded = _model(healthy, "cached generation")
    assert decoded.status == "pass", decoded.message
    restarting = diagnose_model(small(model_modules.RestartingPassedCacheGPT))
    assert failing(restarting) == [("model", "cached generation")], restarting.text()


def test_t5s_bucketed_attention_is_held_to_no_scale_by_design():
    diagnosis = diagnose_model(small(model_modules.BucketGPT))
    assert diagnosis.healthy, diagnosis.text()
    assert "unscaled by design" in _layer(diagnosis, "agrees with SDPA").message


def test_a_layer_handed_a_position_bias_has_its_scale_measured_from_its_weights():
    healthy = diagnose_model(small(model_modules.HandedBiasGPT))
    assert healthy.healthy, healthy.text()
    assert "s = 0.25, the 1/sqrt(16)" in _layer(healthy, "agrees with SDPA").message
    over_d = _layer(diagnose_model(small(model_modules.OverDGPT)), "agrees with SDPA")
    assert over_d.status == FAIL and "s = 0.0625" in over_d.message, over_d.message


def test_a_decoder_that_counts_positions_from_the_padding_fails_left_padding():
    """OPT's interface (a mask, no position ids): a decoder pads on the left to generate, so
    positions counted from the padding are its own trap; counted from the mask, it passes."""
    wrong = _model(diagnose_model(small(model_modules.ArangePaddedGPT)), "left padding")
    assert wrong.status == FAIL and "left_pad_positions" in wrong.message, wrong.message
    right = diagnose_model(small(model_modules.CountedPaddedGPT))
    assert right.healthy and _model(right, "left padding").status == "pass", right.text()


def test_a_mask_added_twice_is_named_by_the_nan_it_leaves_under_left_padding():
    found = _model(diagnose_model(small(model_modules.TwiceMaskedGPT)), "left padding")
    assert found.status == FAIL and "fully_masked_row" in found.message, found.message


def test_generation_starts_from_the_cache_as_built_not_as_earlier_probes_left_it():
    """A chunk that reads its slots before writing them reads what the model's cache held:
    after the doctor's own forwards of the same prompt, the right keys; as built, zeros."""
    diagnosis = diagnose_model(small(model_modules.ReadBeforeWriteStartPosGPT))
    assert _model(diagnosis, "eval determinism").status == "pass", diagnosis.text()
    assert _model(diagnosis, "cached generation").status == FAIL, diagnosis.text()
    assert diagnose_model(small(model_modules.StartPosGPT)).healthy  # the same, written first


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rotary_angles_from_a_float32_buffer_pass_the_bfloat16_shift_on_every_seed(seed):
    """Angles computed in an ``inv_freq`` buffer's dtype are float32 under autocast; a copy
    cast with .to(torch.bfloat16) would round the buffer too (transformers' own, #25681)."""
    diagnosis = diagnose_model(small(model_modules.BufferRotaryGPT), Config(seed=seed))
    assert _layer(diagnosis, "position shift").status == "pass", diagnosis.text()


@pytest.mark.parametrize(
    ("cls", "trap"),
    [
        ("RestartingRotaryStartPosGPT", "rope_cache_offset"),  # the rotary rows of 0..T-1
        ("LeftOutRotaryStartPosGPT", "stale_cache"),  # the current token's keys left out
        ("TopLeftRotaryStartPosGPT", "cache_causal_alignment"),  # the mask anchored top-left
        ("ChunkTopLeftRotaryStartPosGPT", "cache_causal_alignment"),  # for chunks only
    ],
)
def test_a_cache_kept_inside_names_one_cause(cls, trap):
    """Meta's Llama's interface: which rotary rows it hands its layers for a cached token, and
    whether that token sees the ones before it, tell the three causes apart."""
    diagnosis = diagnose_model(small(getattr(model_modules, cls)))
    found = _model(diagnosis, "cached generation")
    assert found.status == FAIL and named_trap([found]) == trap, found.message
    assert "Known causes" not in found.message  # one cause, not a list that starts with it
    assert diagnose_model(small(model_modules.RotaryStartPosGPT)).healthy  # written right


def test_json_names_the_trap_of_a_failing_model_property(capsys):
    code, out, _ = run_cli(capsys, "doctor", f"{TARGET}:ArangePaddedGPT", "--json")
    assert code == 1
    [padding] = [f for f in json.loads(out)["model"] if f["probe"] == "left padding"]
    assert padding["trap"] == "left_pad_positions"


def test_a_layer_that_inverts_its_models_mask_is_told_so_not_to_pass_another_option():
    diagnosis = diagnose_model(small(model_modules.InvertedPaddingGPT))
    messages = [f.message for f in diagnosis.groups[0].diagnosis.findings if f.status == FAIL]
    assert any("inverts the mask its own model builds" in m for m in messages), diagnosis.text()
    assert not any("--mask" in m for m in messages), diagnosis.text()


def test_a_model_whose_layers_run_no_softmax_is_still_held_to_what_they_say():
    """No attention layer is found (no softmax runs), yet a submodule's name and causal buffer
    say the model is causal: its future leak is still found."""
    diagnosis = diagnose_model(small(model_modules.SoftmaxlessNoGenerateGPT))
    assert not diagnosis.groups
    found = _model(diagnosis, "causal no-leak")
    assert found.status == FAIL and "causal_leak" in found.message, diagnosis.text()


def test_causes_a_finding_cannot_tell_apart_are_all_named_not_the_first():
    """A cached branch that scales its new keys decodes wrong, and nothing the calls show
    tells that from positions restarting or a mask anchored top-left: all three. The
    catalogue's cache_causal_alignment, whose triangle the chunked calls show anchored
    top-left, is named alone."""
    from harness.catalogue import registry
    from harness.validation import build, config_for
    from tests import generation_modules as gm
    from tests.test_probes import make, probe

    stale = probe(make(gm.ScaledWhenCached), Config(causal=True), "cached decoding")
    assert stale.status == FAIL and "Known causes" in stale.message, stale
    trio = "cache_causal_alignment or rope_cache_offset or stale_cache"
    assert named_trap([stale]) == trio
    pair = registry.load("cache_causal_alignment")
    diagnosis = diagnose(build(pair, "buggy"), config_for(pair.card))
    [found] = [f for f in diagnosis.findings if f.probe == "cached decoding"]
    assert found.status == FAIL and found.traps == ("cache_causal_alignment",), found


def test_a_cache_argument_says_decoder_when_nothing_else_does():
    """No generate(), no causal name or buffer: its cache argument says it generates, so its
    dropped mask is a leak, not an encoder's reading both ways."""
    diagnosis = diagnose_model(small(model_modules.MaskFreeCachedGPT))
    assert diagnosis.notes[0].startswith("causal (declared: "), diagnosis.notes
    assert _model(diagnosis, "causal no-leak").status == FAIL, diagnosis.text()


def test_a_cache_made_without_a_length_argument_is_made_with_the_models_own():
    """litgpt's set_kv_cache(batch_size, device=None, dtype=None): no length passed as device."""
    diagnosis = diagnose_model(small(model_modules.DeviceSecondInputPosGPT))
    assert diagnosis.healthy, diagnosis.text()
    assert _model(diagnosis, "cached generation").status == "pass", diagnosis.text()


def test_a_layer_its_model_hands_rotary_tables_is_compared_with_rope():
    """litgpt's attn(x, cos, sin, mask, input_pos) with its cache inside: the tables its model
    selects carry the positions (its code names no rotary), so SDPA is run with RoPE."""
    diagnosis = diagnose_model(small(model_modules.HandedTablesGPT))
    assert diagnosis.healthy, diagnosis.text()
    assert "RoPE" in _layer(diagnosis, "agrees with SDPA").message
    assert "(set_kv_cache)" in _model(diagnosis, "low precision").message  # its own method
    twice = diagnose_model(small(model_modules.TwiceScaledHandedTablesGPT))
    assert failing(twice) == [("h.0.attn", "agrees with SDPA")], twice.text()
    assert named_trap(twice.groups[0].diagnosis.findings) == "double_scale"


def test_a_model_that_makes_its_cache_is_a_decoder_when_nothing_else_says():
    """gpt-fast's setup_caches: a model that makes a cache generates, so its dropped mask is a
    leak, not an encoder's reading both ways (measured, it would pass as one)."""
    diagnosis = diagnose_model(small(model_modules.MaskFreeInputPosGPT))
    assert diagnosis.notes[0].startswith("causal (declared: "), diagnosis.notes
    assert _model(diagnosis, "causal no-leak").status == FAIL, diagnosis.text()


def test_a_model_without_a_config_is_probed_within_its_position_table():
    """No attribute, mask buffer or config says its context: the rows of its wpe (32) do, so
    no probe runs past them."""
    diagnosis = diagnose_model(small(model_modules.TablePositionsGPT))
    assert diagnosis.healthy, diagnosis.text()


class ArangeLlama(transformers.LlamaForCausalLM):
    """A forward that overwrites the position ids it is given with 0..T-1 on every call."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None,
                past_key_values=None, use_cache=None, **kwargs):  # fmt: skip
        position_ids = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        kwargs.pop("cache_position", None)
        return super().forward(input_ids, attention_mask, position_ids, past_key_values,
                               use_cache=use_cache, **kwargs)  # fmt: skip


def test_rotary_tables_that_ignore_the_position_ids_given_are_the_layers_own():
    """Its model hands the layer tables for 0..T-1 whatever positions a probe asks: the layer is
    rotary all the same and agrees with SDPA under RoPE; the model's cache is what fails."""
    diagnosis = diagnose_model(small(ArangeLlama))
    assert failing(diagnosis) == [("model", "cached generation")], diagnosis.text()
    assert "RoPE (half)" in _layer(diagnosis, "agrees with SDPA").message


class CachedRestartLlama(transformers.LlamaForCausalLM):
    """A fork's forward that numbers the tokens 0..T-1 whenever its cache holds some, whatever
    position ids it is given."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None,
                past_key_values=None, use_cache=None, **kwargs):  # fmt: skip
        if past_key_values is not None and past_key_values.get_seq_length() > 0:
            position_ids = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        return super().forward(input_ids, attention_mask, position_ids, past_key_values,
                               use_cache=use_cache, **kwargs)  # fmt: skip


def test_position_ids_a_model_ignores_under_its_cache_are_not_taken_as_passed():
    """Its full forward follows the positions it is given; under its cache it does not, so a
    retry with them proves nothing: both causes stay, and none is said to be ruled out."""
    found = _model(diagnose_model(small(CachedRestartLlama)), "cached generation")
    assert found.status == FAIL and "under its cache it ignores the position ids" in found.message
    assert "rope_cache_offset" in named_trap([found]), found.message
    assert "counted on from it" not in found.message


def test_position_ids_a_model_ignores_are_not_taken_as_passed():
    """Retrying with position ids proves nothing where the forward rebuilds them: its restart
    stays among the causes, and no message says its positions count on."""
    found = _model(diagnose_model(small(model_modules.OverriddenPositionsGPT)), "cached generation")
    assert found.status == FAIL, found.message
    assert "its forward ignores the position ids it is given" in found.message
    assert "rope_cache_offset" in named_trap([found]), found.message
    assert "counted on from it" not in found.message


def _sequence_first_lm(**bug):
    torch.manual_seed(0)
    return model_modules.SequenceFirstLM(model_modules.GPTConfig(), **bug)


def test_layers_a_model_calls_with_sequence_first_tensors_are_found_and_probed():
    """(T, B, C) hidden states: the layer is found, turned round for the probes, healthy; its
    causality is read off the additive mask the model hands its layers (no name, no
    generate())."""
    diagnosis = diagnose_model(_sequence_first_lm())
    assert [g.paths for g in diagnosis.groups] == [["blocks.0.attn", "blocks.1.attn"]]
    assert diagnosis.healthy, diagnosis.text()
    assert (
        "causal (declared: it hands its attention layers a causal mask (`mask`))"
        in (diagnosis.notes[0])
    )


def test_a_scale_dropped_in_every_sequence_first_layer_is_named_at_its_line():
    diagnosis = diagnose_model(_sequence_first_lm(scaled=False))
    (group,) = diagnosis.groups
    assert first_trap(group.diagnosis) == "missing_scale", diagnosis.text()


def test_a_registered_causal_mask_makes_a_model_whose_layers_never_get_it_leak():
    diagnosis = diagnose_model(_sequence_first_lm(masked=False))
    found = _model(diagnosis, "causal no-leak")
    assert found.status == FAIL and found.traps == ("causal_leak",), diagnosis.text()


def test_a_scaling_attribute_does_not_excuse_the_wrong_scale_the_forward_shows():
    """Where SDPA compares at neither scale (a scaled rotary it does not reproduce), a layer's
    ``scaling = 1`` does not make its unscaled scores the design (fair-esm's bug); the usual
    scaling with the same rotary is healthy."""
    diagnosis = diagnose_model(_sequence_first_lm(scaling=1.0, speed=2.0))
    (group,) = diagnosis.groups
    assert first_trap(group.diagnosis) == "missing_scale", diagnosis.text()
    assert diagnose_model(_sequence_first_lm(speed=2.0)).healthy
    designed = _sequence_first_lm(scaling=1.0, speed=2.0)  # Granite's attention_multiplier
    designed.config = SimpleNamespace(attention_multiplier=1.0)
    assert diagnose_model(designed).healthy


def test_a_shape_its_model_cannot_make_is_not_the_layers_failure():
    diagnosis = diagnose_model(small(model_modules.ShortPositionsGPT))
    assert diagnosis.healthy, diagnosis.text()
    shapes = next(f for f in diagnosis.groups[0].diagnosis.findings if f.probe == "shape contract")
    assert "not taken: seq_len == d_model: NotImplementedError: its model does not run" in (
        shapes.message
    ), shapes.message


def test_a_model_whose_layers_build_their_own_triangle_is_causal_by_what_they_compute():
    healthy = diagnose_model(small(model_modules.BuiltMaskGPT))
    assert healthy.healthy, healthy.text()
    assert (
        "causal (declared: its attention layers mask the future themselves, at"
        in (healthy.notes[0])
    ), healthy.notes
    buggy = diagnose_model(small(model_modules.QueriesSoftmaxGPT))
    assert buggy.notes[0].startswith("causal (declared: its attention layers mask"), buggy.notes
    first = next(line for line in buggy.text().splitlines() if line.startswith("FAIL"))
    assert "softmax_dim at tests/model_modules.py:" in first, buggy.text()


def test_a_model_that_hands_its_layers_a_causal_mask_is_causal_and_an_inverted_one_is_named():
    healthy = diagnose_model(small(model_modules.HandedMaskGPT))
    assert healthy.healthy, healthy.text()
    assert healthy.notes[0].startswith("causal (declared: it hands its attention layers a "
                                       "causal mask"), healthy.notes  # fmt: skip
    inverted = diagnose_model(small(model_modules.InvertedHandedMaskGPT))
    assert first_trap(inverted.groups[0].diagnosis) == "sdpa_mask_inverted", inverted.text()
    assert "causal no-leak" in [f.probe for f in inverted.failures], inverted.text()


def test_an_index_error_in_the_model_before_the_layer_is_a_shape_not_taken():
    """More tokens than its offset table holds raise IndexError (a LookupError) in the model's
    embedding: the layer is not failed for it."""
    diagnosis = diagnose_model(build(model_modules.OffsetPositionsGPT, Sizes(context=64), 0))
    assert diagnosis.healthy, diagnosis.text()


def test_fix_on_a_whole_model_writes_nothing_and_says_where_fixes_are_proven(capsys, tmp_path):
    out = tmp_path / "fix.diff"
    code, said, err = run_cli(capsys, "doctor", f"{TARGET}:LeakyGPT", "--fix", str(out))
    assert code == 1 and "causal_leak" in said
    assert not out.exists()
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith("--fix: fixes are proven on one attention module, so nothing was written")
    ), err
