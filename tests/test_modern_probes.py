"""The doctor's probes for modern attention: caches in each convention real code uses, positions
(declared or detected), grouped heads, windows, packing, and the --call adapter."""

import json
import re
from dataclasses import replace

import pytest
import torch
from torch import Tensor

from harness.doctor import FAIL, PASS, SKIP, WARN, Config, diagnose
from harness.doctor.subject import Subject
from harness.errors import UsageError
from harness.masks import MaskSpec
from harness.scenarios import SCENARIOS, make_call
from tests import call_modules as cm
from tests import generation_modules as gm
from tests import object_cache_modules as ocm
from tests.test_probes import catalogue, make, probe

CAUSAL = Config(causal=True)


@pytest.mark.parametrize(
    ("module", "convention"),
    [(gm.LayerPast, "given back what the previous call returned"), (gm.StartPos, "its own cache")],
)
def test_each_cache_convention_is_detected_and_a_correct_module_decodes(module, convention):
    subject = Subject(make(module), CAUSAL)
    assert convention in subject.cache_source
    found = probe(make(module), CAUSAL, "cached decoding")
    assert found.status == PASS, found


def test_a_rolling_cache_of_its_window_is_judged_on_that_window_not_its_length():
    found = probe(make(gm.Rolling), CAUSAL, "cached decoding")
    assert found.status == PASS and "up to its window of 3 (rolling)" in found.message, found


def test_a_cache_returned_stacked_in_one_tensor_is_passed_back_and_judged():
    found = probe(make(gm.LayerPast, stacked=True), CAUSAL, "cached decoding")
    assert found.status == PASS and "cache length = tokens fed" in found.message, found
    stale = probe(make(gm.LayerPast, stale=True, stacked=True), CAUSAL, "cached decoding")
    assert stale.status == FAIL, stale


def test_a_returned_cache_without_the_current_token_fails_decoding():
    found = probe(make(gm.LayerPast, stale=True), CAUSAL, "cached decoding")
    assert found.status == FAIL and "decode: max error" in found.message, found


def test_a_causal_mask_anchored_top_left_fails_decoding_and_is_named():
    found = probe(make(gm.StartPos, top_left=True), CAUSAL, "cached decoding")
    assert found.status == FAIL and found.traps == ("cache_causal_alignment",), found
    assert "its causal mask (the triangle it fills) is anchored at the top-left" in found.message


def test_a_cache_written_at_the_wrong_slots_is_named_stale_cache_from_what_it_wrote():
    assert probe(make(gm.ReadsItsCache), CAUSAL, "cached decoding").status == PASS
    found = probe(make(gm.ReadsItsCache, forgets_start=True), CAUSAL, "cached decoding")
    assert found.status == FAIL and found.traps == ("stale_cache",), found
    assert "the call fed positions 3..5 wrote `cache_k` at slots 0..2" in found.message, found


def test_is_causal_with_fewer_queries_than_keys_is_named_cache_causal_alignment_alone():
    assert probe(make(gm.SdpaIsCausal, aligned=True), CAUSAL, "cached decoding").status == PASS
    found = probe(make(gm.SdpaIsCausal), CAUSAL, "cached decoding")
    assert found.status == FAIL and found.traps == ("cache_causal_alignment",), found
    assert "causal mask (SDPA told is_causal=True) is anchored at the top-left" in found.message


def test_is_causal_told_for_one_decoded_token_only_is_named_from_the_decoding_itself():
    """Chunks get a mask anchored bottom-right and agree; one token at a time gets
    ``is_causal=True``: the decoding that disagrees is watched too, and shows SDPA told so."""
    found = probe(make(gm.SdpaIsCausalForOne), CAUSAL, "cached decoding")
    assert found.status == FAIL and found.traps == ("cache_causal_alignment",), found
    assert "causal mask (SDPA told is_causal=True) is anchored at the top-left" in found.message


@pytest.mark.parametrize(
    ("module", "code"),
    [
        (gm.SdpaIsCausal, "out = F.scaled_dot_product_attention(q, keys, values, is_causal=True)"),
        (gm.SdpaIsCausalForOne, "out = F.scaled_dot_product_attention("),
        (gm.StartPos, "allowed = torch.ones(T, S, dtype=torch.bool).tril(0 if top_left else"),
        (gm.BufferCutTopLeft, "causal = self.bias[:T, :S]"),
    ],
)
def test_a_mask_anchored_top_left_under_a_cache_is_a_cause_where_the_module_makes_it(module, code):
    """The cached decoding probe says which anchoring it saw; the cause is the line the
    recorded forward shows making it: the SDPA call, or the triangle the module builds."""
    kwargs = {"top_left": True} if module is gm.StartPos else {}
    d = diagnose(make(module, **kwargs), CAUSAL)
    assert [c.trap for c in d.causes] == ["cache_causal_alignment"], d.text()
    assert code in d.causes[0].at, d.causes[0]


def test_cached_calls_a_module_refuses_with_not_implemented_are_not_taken():
    """Chunked prefill refused with NotImplementedError (its model never sends it): the decode
    it takes is judged alone, and the finding says what was not taken."""
    found = probe(make(gm.OneTokenAfterThePrompt), CAUSAL, "cached decoding")
    assert found.status == PASS and "chunked: not taken (NotImplementedError)" in found.message
    wrong = probe(make(gm.OneTokenAfterThePrompt, top_left=True), CAUSAL, "cached decoding")
    assert wrong.status == FAIL and wrong.message.startswith("decode: "), wrong


def test_a_cache_of_a_module_that_is_not_causal_as_called_is_not_probed_as_a_decoder():
    for name in ("cached decoding", "cache reuse"):
        found = probe(make(gm.LayerPast), Config(), name)  # neither --causal nor a causal mask
        assert found.status == SKIP and "bidirectional encoder" in found.message, found


def test_a_module_without_a_cache_skips_the_generation_probes_and_says_why():
    for name in ("cached decoding", "cache reuse"):
        found = probe(make(gm.IgnoresPos), Config(), name)
        assert found.status == SKIP and "takes no cache" in found.message, found


def test_positions_the_output_ignores_are_not_positions_even_where_rotary_is_named():
    """x-transformers' Attention takes ``pos`` and names rotary, and ignores both unless
    configured: its forward rotates nothing, so it has no positions (no warning that it might
    be rotary, as ESM-1's layer, whose class names rotary, once got); declared, it fails."""
    module = make(gm.IgnoresPos)
    subject = Subject(module, Config())
    assert subject.position_scheme == "none" and "ignores `pos`" in subject.position_source
    assert probe(module, Config(), "permutation equivariance").status == PASS
    order = probe(module, Config(), "token order")
    assert order.status == SKIP, order
    declared = probe(module, Config(positions="relative"), "token order")
    assert declared.status == FAIL, declared


def test_rotary_is_detected_from_behaviour_and_a_shift_is_judged():
    assert Subject(make(gm.Rotary), CAUSAL).position_scheme == "relative"
    assert probe(make(gm.Rotary), CAUSAL, "position shift").status == PASS
    found = probe(make(gm.Rotary, on_value=True), CAUSAL, "position shift")
    assert found.status == FAIL and "rope_on_value" in found.message, found


def test_a_shift_that_moves_the_scores_and_not_the_values_names_the_pairing():
    """q in halves, k in pairs: with every token the same a shift changes nothing, so the
    scores carry the absolute position (rope_pairing_mismatch), not the values."""
    found = probe(make(gm.Rotary, mixed=True), CAUSAL, "position shift")
    assert found.status == FAIL and "rope_pairing_mismatch" in found.message, found
    assert "rope_on_value" not in found.message, found


def test_a_shift_the_values_do_not_carry_is_not_named_rope_on_value_where_v_is_read_unrotated():
    """An unrotated null key makes the scores depend on the query's absolute rotation: the
    shift fails, but the forward shows v unrotated, so rope_on_value is not named."""
    d = diagnose(make(gm.NullKeyRotary), CAUSAL)
    found = next(f for f in d.findings if f.probe == "position shift")
    assert found.status == FAIL and "not the values" in found.message, found
    assert "rope_on_value" not in found.traps and not d.causes, d.text()


def test_a_window_of_both_sides_is_not_a_causal_mask():
    """A band blocks keys far ahead and far behind: no causal intent is read off it."""
    d = diagnose(make(gm.BandAttention), Config())
    assert not d.config.causal and not any(f.probe == "causality" for f in d.findings), d.text()


def test_a_bidirectional_window_is_held_to_one_reach_each_side():
    """Its reach is reported, not held to w (conventions differ); uneven reach fails."""
    found = probe(make(gm.BandAttention), Config(), "sliding window")
    assert found.status == PASS and "t-3..t+3" in found.message, found
    uneven = probe(make(gm.BandAttention, ahead=1), Config(), "sliding window")
    assert uneven.status == FAIL and "a bidirectional module" in uneven.message, uneven


def test_rotary_is_what_the_forward_does_not_what_the_code_names():
    """IgnoresPos's code names rotary_pos_emb and never rotates: its forward shows no rotation,
    and it is not taken for rotary; a module that rotates is, at its line."""
    d = diagnose(make(gm.IgnoresPos), CAUSAL)
    assert not any(f.name == "rotary" for f in d.facts), d.text()
    found = {f.probe: f for f in d.findings}
    assert "rotates" not in found["position shift"].message, d.text()
    rotating = diagnose(*catalogue("rope_on_value", "fixed"))
    [fact] = [f for f in rotating.facts if f.name == "rotary"]
    assert "fixed.py:" in fact.line, rotating.text()


@pytest.mark.parametrize(
    ("pitfall", "probe_name", "trap"),
    [
        ("cache_causal_alignment", "cached decoding", "cache_causal_alignment"),
        ("rope_cache_offset", "cached decoding", "rope_cache_offset"),
        ("stale_cache", "cache reuse", "stale_cache"),
        ("gqa_kv_grouping", "grouped heads", "gqa_kv_grouping"),
        ("rope_low_precision", "position shift", "rope_low_precision"),
        ("rope_on_value", "position shift", "rope_on_value"),
        ("rope_wrong_axis", "token order", "rope_wrong_axis"),
        ("left_pad_positions", "left padding", "left_pad_positions"),
        ("packing_cross_document", "packed documents", "packing_cross_document"),
        ("sliding_window_off_by_one", "sliding window", "sliding_window_off_by_one"),
        ("rope_pairing_mismatch", "agrees with SDPA", "rope_pairing_mismatch"),
        ("double_scale", "agrees with SDPA", "double_scale"),
        ("naive_exp_softmax", "float16 robustness", "naive_exp_softmax"),
    ],
)
def test_each_modern_trap_fails_its_own_probe_naming_it_and_its_fix_passes(
    pitfall, probe_name, trap
):
    module, config = catalogue(pitfall)
    found = probe(module, config, probe_name)
    assert found.status == FAIL and trap in found.message, found
    fixed, config = catalogue(pitfall, "fixed")
    assert probe(fixed, config, probe_name).status != FAIL  # a warning is not a failure


def test_a_call_adapter_feeds_the_module_and_its_make_cache_gives_the_cache():
    calls = []

    def adapter(module, x, *, positions, mask, cache):
        calls.append(positions)
        return module(x, positions)

    module = make(gm.Rotary)
    found = probe(module, Config(causal=True, call=adapter), "position shift")
    assert found.status == PASS and calls, found
    skipped = probe(module, Config(causal=True, call=adapter), "cached decoding")
    assert skipped.status == SKIP and "make_cache" in skipped.message


def test_the_json_names_the_adapter():
    def adapter(module, x, *, positions, mask, cache):
        return module(x, positions)

    d = diagnose(make(gm.Rotary), Config(causal=True, call=adapter), "rotary")
    assert json.loads(d.to_json())["config"]["call"].endswith(":" + adapter.__qualname__)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"positions": "rotary"}, "--positions must be one of"),
        ({"kv_heads": 0}, "--kv-heads"),
        ({"window": 0}, "--window"),
        ({"rope_pairing": "neox"}, "--rope-pairing"),
    ],
)
def test_bad_modern_options_are_one_clear_line(options, message):
    with pytest.raises(UsageError, match=message):
        Config(**options)


def test_a_window_read_off_the_module_is_probed_exactly():
    module, config = catalogue("sliding_window_off_by_one", "fixed")
    found = probe(module, config, "sliding window")
    assert found.status == PASS and "read off the module" in found.message, found
    narrower = probe(module, replace(config, window=2), "sliding window")
    assert narrower.status == FAIL, narrower


def test_weight_only_on_the_key_before_the_window_names_the_window_off_by_one():
    """The weights probe fails first in a layer's table: where its masked weight lies only on
    key t - w, it names the window one key too wide itself; weight on keys further back is not
    that trap."""
    module, config = catalogue("sliding_window_off_by_one")
    found = probe(module, config, "attention weights")
    assert found.status == FAIL and "(sliding_window_off_by_one:" in found.message, found
    wider = probe(module, replace(config, window=2), "attention weights")
    assert wider.status == FAIL and "sliding_window_off_by_one" not in wider.message, wider


def test_the_doctor_builds_grouped_heads_by_default_and_kv_heads_can_be_set():
    from harness.doctor.target import Sizes, value_for

    assert value_for("num_key_value_heads", Sizes(64, 4)) == 2
    assert value_for("num_key_value_heads", Sizes(64, 4, kv_heads=4)) == 4
    assert value_for("num_key_value_groups", Sizes(64, 4)) == 2
    with pytest.raises(UsageError, match="--kv-heads must divide --heads"):
        Sizes(64, 4, kv_heads=3)


def test_strided_k_v_heads_are_a_warning_unless_a_grouping_is_declared():
    """x-transformers tiles its K/V heads: sound when trained so, wrong for Llama's layout."""
    module, config = catalogue("gqa_kv_grouping")  # its user declares blocks: a failure
    assert probe(module, config, "grouped heads").status == FAIL
    auto = probe(module, replace(config, kv_grouping="auto"), "grouped heads")
    assert auto.status == WARN and "gqa_kv_grouping" in auto.message, auto
    assert probe(module, replace(config, kv_grouping="strided"), "grouped heads").status == PASS
    fixed, config = catalogue("gqa_kv_grouping", "fixed")
    assert probe(fixed, replace(config, kv_grouping="strided"), "grouped heads").status == FAIL
    sdpa = probe(module, replace(config, kv_grouping="auto"), "agrees with SDPA")
    assert sdpa.status == PASS and "strided grouping" in sdpa.message, sdpa


def test_the_transformers_adapter_names_a_missing_rotary_class_in_one_line():
    transformers = pytest.importorskip("transformers")
    from harness.doctor import adapters

    config = transformers.LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2)
    llama = transformers.models.llama.modeling_llama.LlamaAttention
    mine = type("MyLlamaAttention", (llama,), {"__module__": __name__})  # its base's rotary
    assert diagnose(make(mine, config, layer_idx=0), Config(call=adapters.transformers)).healthy

    class NoRotaryHere(cm.TransformersRotary):  # no base from a file with a rotary class
        pass

    alone = NoRotaryHere(32, 4)
    alone.config = config
    with pytest.raises(UsageError, match=re.escape("no ...RotaryEmbedding class in tests.")):
        diagnose(alone, Config(call=adapters.transformers))


def test_a_cache_whose_length_is_not_the_tokens_fed_fails_even_with_right_outputs():
    found = probe(make(ocm.ObjectCache), CAUSAL, "cached decoding")
    assert found.status == FAIL and "the cache holds 8 tokens after 4 were fed" in found.message


def test_each_cached_call_gets_its_rows_of_the_mask_and_every_key_seen_so_far():
    seen = []

    def invoke(module, x, mask, positions, cache, start):
        seen.append((start, tuple(mask.shape)))
        return x

    keep = torch.ones(2, 8, 8, dtype=torch.bool).tril()
    call = make_call(SCENARIOS["chunked"], keep, MaskSpec("keep"), None, ocm.TwiceCountedCache,
                     invoke)  # fmt: skip
    call(None, torch.zeros(2, 8, 4))
    assert seen == [(0, (2, 3, 3)), (3, (2, 3, 6)), (6, (2, 2, 8))]


@pytest.mark.parametrize("command", [["doctor", "-h"], ["report", "-h"], ["-h"]])
def test_every_help_prints(command, capsys):
    from harness import cli

    assert cli.main(command) == 0
    assert "usage:" in capsys.readouterr().out


def test_a_copy_in_another_dtype_keeps_complex_tables_complex():
    from torch import nn

    from harness.runner import as_dtype

    module = nn.Module()
    module.register_buffer("freqs_cis", torch.polar(torch.ones(4, 2), torch.rand(4, 2)))
    copied = as_dtype(module, torch.device("cpu"), torch.float64)
    assert copied.freqs_cis.dtype == torch.complex128
    assert torch.equal(copied.freqs_cis.imag.float(), module.freqs_cis.imag)


def test_a_cache_attribute_that_is_none_is_not_a_cache():
    """torchtune's kv_cache is None until setup_cache(): no cache to probe then."""
    module = make(gm.StartPos)
    module.cache_k = module.cache_v = None  # as before a setup call
    del module._buffers["cache_k"], module._buffers["cache_v"]
    module.kv_cache = None
    assert Subject(module, CAUSAL).new_cache is None


@pytest.mark.parametrize("layer", [0, 1])
def test_a_transformers_layer_past_the_first_is_asked_for_its_own_cache_length(layer):
    """A DynamicCache counts tokens per layer; asked without the layer it answers for layer 0,
    which the layer with layer_idx=1 never fills."""
    transformers = pytest.importorskip("transformers")
    from harness.doctor import adapters

    config = transformers.LlamaConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2
    )
    llama = transformers.models.llama.modeling_llama.LlamaAttention
    found = probe(
        make(llama, config, layer_idx=layer),
        Config(mask="additive", mask_shape="b1qk", call=adapters.transformers),
        "cached decoding",
    )
    assert found.status == PASS, found


def test_the_transformers_adapter_fills_optional_inputs_and_names_one_it_cannot_make():
    transformers = pytest.importorskip("transformers")
    from harness.doctor import adapters

    config = transformers.LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2)
    llama = transformers.models.llama.modeling_llama.LlamaAttention

    class WithAlibi(llama):  # Falcon's way: an input its rotary model leaves as None
        def forward(self, hidden_states, alibi: Tensor | None, position_embeddings, **kwargs):
            assert alibi is None
            return super().forward(hidden_states, position_embeddings, **kwargs)

    class WithBias(llama):  # MPT's way: a bias the model builds
        def forward(self, hidden_states, position_bias: Tensor, position_embeddings, **kwargs):
            return super().forward(hidden_states, position_embeddings, **kwargs)

    call = Config(call=adapters.transformers)
    assert diagnose(make(WithAlibi, config, layer_idx=0), call).healthy
    with pytest.raises(UsageError, match=r"needs `position_bias`, which its model builds"):
        diagnose(make(WithBias, config, layer_idx=0), call)
