"""The doctor's probes for modern attention: caches in each convention real code uses, positions
(declared or detected), grouped heads, windows, packing, and the --call adapter."""

import importlib
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import Tensor

from harness.doctor import FAIL, PASS, SKIP, WARN, Config, Finding, diagnose
from harness.doctor.probes.diverge import _window
from harness.doctor.probes.generation import _reset_at
from harness.doctor.probes.heads import reached
from harness.doctor.probes.slots import Call, expected_slots, misplaced
from harness.doctor.reading.checks import read_failures
from harness.doctor.reading.known import Named, Reading
from harness.doctor.reading.record import shown_path
from harness.doctor.subject import Subject
from harness.errors import UsageError
from harness.masks import MaskSpec
from harness.scenarios import SCENARIOS, make_call
from tests import call_modules as cm
from tests import generation_modules as gm
from tests import object_cache_modules as ocm
from tests import slot_cache_modules as scm
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
    """Keys one short of every key so far: nothing to compare them with, so the causes it
    cannot tell apart are all named."""
    found = probe(make(gm.LayerPast, stale=True), CAUSAL, "cached decoding")
    assert found.status == FAIL and "decode: max error" in found.message, found
    assert found.traps == ("cache_causal_alignment", "rope_cache_offset", "stale_cache"), found


def test_keys_joined_to_the_past_in_the_wrong_order_are_stale_cache_at_the_join():
    """Kosmos-2's slip, ``cat([new, past])`` for the keys: the cached call reads every key
    so far, joined where only cached calls join them, and they are not the full forward's:
    stale_cache at that line."""
    assert probe(make(gm.JoinsItsPast), CAUSAL, "cached decoding").status == PASS
    found = probe(make(gm.JoinsItsPast, new_first=True), CAUSAL, "cached decoding")
    assert found.status == FAIL and found.traps == ("stale_cache",), found
    assert found.at.startswith(_line(gm, "k = torch.cat([k, layer_past[0]]")), found.at


def test_a_cached_call_that_differs_in_an_op_both_paths_run_names_the_causes_it_cannot_tell():
    """Keys scaled on the cached path only (nothing the cached calls assemble differs, and no
    op restarts): the three causes, none alone, and the line where the calls first differ."""
    found = probe(make(gm.ScaledWhenCached), CAUSAL, "cached decoding")
    assert found.status == FAIL, found
    assert found.traps == ("cache_causal_alignment", "rope_cache_offset", "stale_cache"), found
    assert "(they first differ at tests/generation_modules.py:" in found.message, found


def test_the_doctors_own_cache_reset_is_never_shown_as_the_users():
    subject = Subject(make(gm.LayerPast), CAUSAL)
    x = subject.x(2, 8, 0).double()
    assert _reset_at(subject, x, None) == ""


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


def _line(module: object, text: str) -> str:
    """``file.py:N`` of the first line of ``module``'s source holding ``text``, as the
    doctor shows it."""
    path = Path(module.__file__)
    number = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)
    return f"{shown_path(str(path))}:{number}"


def test_a_cache_counter_moved_one_slot_whatever_was_written_is_named_where_it_is_moved():
    """torchtune's ``cache_pos.add_(1)``: a later call writes over an earlier one's keys; the
    write's index is read from the counter, so the line that moved it last is the cause (the
    decoding path's, not the prompt's, which moved it right)."""
    for name in ("cached decoding", "cache reuse"):
        assert probe(make(scm.SlotCached), CAUSAL, name).status == PASS
    found = probe(make(scm.SlotCached, moved=1), CAUSAL, "cached decoding")
    assert found.status == FAIL and found.traps == ("stale_cache",), found
    assert found.at.startswith(_line(scm, "pos.add_(T if moved")), found.at
    assert "positions 6..7 went to slots 4..5 of `cache.slots.k`, through the index at" in found.why


def test_keys_written_past_their_slots_are_named_at_the_index_that_put_them_there():
    """gpt-fast's ``index_copy_(2, input_pos + 1, k)``: already the prompt is misplaced, at
    the line that computed the index (a counter read as it was is not the cause)."""
    found = probe(make(scm.SlotCached, shift=1), CAUSAL, "cached decoding")
    assert found.status == FAIL and found.traps == ("stale_cache",), found
    assert found.at.startswith(_line(scm, "slots + shift] = k")), found.at
    assert found.why.endswith("positions 0..2 went to slots 1..3 of `cache.slots.k`"), found.why


def test_a_reset_that_leaves_the_old_prompt_is_named_at_the_reset():
    """Where ``reset()`` runs torch ops (zeroing in place), the first of them; where it runs
    none (a count left as it was), the method's own first line."""
    forgets = probe(make(scm.SlotCached, forgets=True), CAUSAL, "cache reuse")
    assert forgets.status == FAIL and forgets.traps == ("stale_cache",), forgets
    assert forgets.at.startswith(_line(scm, "def reset(")), forgets.at
    zeroing = probe(*catalogue("stale_cache"), "cache reuse")
    assert zeroing.status == FAIL and zeroing.traps == ("stale_cache",), zeroing
    catalogue_pair = importlib.import_module("pitfalls.stale_cache.buggy")
    assert zeroing.at.startswith(_line(catalogue_pair, ".zero_()")), zeroing.at


def test_a_cached_query_turned_from_position_0_is_rope_cache_offset_at_the_line_that_restarts():
    """The cached call computes there what the full forward computes for the first positions,
    so the positions restart on each call; a local ``arange(T)`` the next op counts on from
    the cache (``+ start_pos``), or one a check on the side reads, is not where it goes
    wrong."""
    assert probe(make(gm.RotaryStartPos), CAUSAL, "cached decoding").status == PASS
    found = probe(make(gm.RotaryStartPos, first_rows=True), CAUSAL, "cached decoding")
    assert found.status == FAIL and found.traps == ("rope_cache_offset",), found
    assert found.at.startswith(_line(gm, "rows = fed - start_pos")), found.at
    said = "a cached call fed position 4 gets here what position 0 gets in the full forward"
    assert found.why == said, found.why


def test_a_trap_watched_at_a_line_is_the_first_cause_printed_at_it():
    diagnosis = diagnose(make(scm.SlotCached, moved=1), CAUSAL)
    first = diagnosis.causes[0]
    assert (first.trap, first.probes) == ("stale_cache", ("cached decoding",)), diagnosis.causes
    assert first.at.startswith(_line(scm, "pos.add_(T if moved")), first.at
    assert diagnosis.text().splitlines()[1].startswith(f"FAIL  stale_cache{' ' * 10}")


def test_a_cached_calls_result_is_compared_with_the_part_of_the_full_forward_it_computes():
    full = torch.arange(2 * 8 * 8).reshape(2, 8, 8)  # (B, T, T): queries, keys
    scores = full[:, 3:6, :6]  # a call fed positions 3..5: its queries, and the 6 keys so far
    assert torch.equal(_window(scores, full, 3, 3, first=False), scores)
    assert torch.equal(_window(scores, full, 3, 3, first=True), full[:, :3, :6])
    assert _window(full[:, :, :5], full, 3, 3, first=False) is None  # 5: no positions of it
    assert _window(full, full, 3, 3, first=False) is None  # a whole table says nothing


def test_a_write_belongs_at_its_positions_or_modulo_a_rolling_buffer_it_overruns():
    assert expected_slots(3, 3, 64) == [3, 4, 5]
    assert expected_slots(3, 3, 4) == [0, 1, 3]  # positions 3, 4, 5 in a buffer of 4
    rolling = [Call(0, 3, {"k": torch.zeros(1, 4)}, {"k": torch.tensor([[1.0, 1, 1, 0]])}),
               Call(3, 2, {"k": torch.tensor([[1.0, 1, 1, 0]])},
                    {"k": torch.tensor([[2.0, 1, 1, 2]])})]  # fmt: skip
    assert misplaced(rolling) is None
    rolling[1].after["k"] = torch.tensor([[1.0, 2, 2, 0]])  # written over positions 1, 2
    found = misplaced(rolling)
    assert found is not None and (found.call, found.wrote, found.meant) == (1, [1, 2], [0, 3])


def test_a_window_cut_from_positions_the_caller_hands_in_is_located_at_its_bound():
    """RecurrentGemma's band, ``q_pos <= k_pos + w``, made from the positions its model
    passes: the mask is not the module's alone, but the comparison that bounds it is."""
    config = Config(causal=True, window=3, positions="relative")
    assert diagnose(make(gm.BandFromPositions), config).healthy
    found = diagnose(make(gm.BandFromPositions, one_more=True), config)
    assert [c.trap for c in found.causes] == ["sliding_window_off_by_one"], found.text()
    assert found.causes[0].at.startswith(_line(gm, "near = ago <= self.window")), found.causes[0]


def test_a_table_made_before_the_call_for_the_other_pairing_is_read_where_the_forward_reads_it():
    """MiniCPM's cos table, a buffer repeated for pairs while its turn pairs halves: the
    repeat is not in the recorded forward, so the mismatch is shown where the forward reads
    the table; the correct layout shows none."""
    config = Config(causal=True, positions="relative")
    assert not any(
        f.name == "rotary pairing" for f in diagnose(make(gm.BufferTablesRotary), config).facts
    )
    found = diagnose(make(gm.BufferTablesRotary, pairs=True), config)
    fact = next(f for f in found.facts if f.name == "rotary pairing")
    assert "turns halves" in fact.value and "for pairs" in fact.value, fact
    assert fact.line.startswith(_line(gm, "cos = self.cos_cached[index]")), fact
    assert [c.trap for c in found.causes][:1] == ["rope_pairing_mismatch"], found.text()


def test_a_pairing_mismatch_read_off_the_values_fails_as_read_where_nothing_could_measure_it():
    """A position shift or the SDPA comparison sees a table laid out for the other pairing;
    where neither ran (an adapter that refuses shifted positions), the reading fails it."""
    named = Named("rope_pairing_mismatch", "turns halves; table for pairs", "a.py:9", located=True)
    reading = Reading(named=[named])
    unmeasured = [
        Finding("position shift", SKIP, "refused"),
        Finding("agrees with SDPA", SKIP, "-"),
    ]
    [found] = read_failures(reading, unmeasured)
    assert found.status == FAIL and found.traps == ("rope_pairing_mismatch",), found
    shifted = [Finding("position shift", FAIL, "moved"), Finding("agrees with SDPA", SKIP, "-")]
    assert read_failures(reading, shifted) == []


class _PackedRows(torch.nn.Module):
    """mistral-inference's layout: sequences packed as rows (N, d), 2 K/V heads of width 2
    copied in blocks to 4 query heads before the output projection."""

    def __init__(self) -> None:
        super().__init__()
        self.v_proj, self.o_proj = torch.nn.Linear(8, 4), torch.nn.Linear(8, 8)

    def forward(self, rows: Tensor) -> Tensor:
        values = self.v_proj(rows).view(-1, 2, 2)  # (N, kv heads, d)
        return self.o_proj(values.repeat_interleave(2, dim=1).reshape(-1, 8))  # (N, h d)


def test_the_heads_a_kv_head_reaches_are_read_whatever_the_rows_layout():
    module, rows = _PackedRows(), torch.randn(6, 8)
    reach = [reached(module, lambda: module(rows), module.v_proj, module.o_proj, 4, j, 2, 8)
             for j in (0, 1)]  # fmt: skip
    assert reach == [{0, 1}, {2, 3}], reach
