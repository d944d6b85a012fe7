"""Calling a module as published: arguments bound by name, never by position into another one."""

import pytest
import torch

from harness.doctor import Config, diagnose
from harness.doctor.calling import plan_call, qkv_inputs
from harness.doctor.subject import Subject
from harness.errors import UsageError
from tests import call_modules as cm
from tests import doctor_modules as dm


@pytest.mark.parametrize("cls", [cm.CrossInputFirst, cm.QueryKeyValue, cm.KeywordOnly])
def test_correct_modules_called_by_name_are_healthy_and_masked(cls):
    d = diagnose(cls(32, 4), Config(mask="keep"))
    assert d.healthy, d.text()
    status = {f.probe: f.status for f in d.findings}
    assert status["causal no-leak"] == status["padding no-leak"] == "pass"


def test_the_mask_goes_to_its_own_parameter_not_the_cross_attention_input():
    plan = plan_call(cm.CrossInputFirst(), takes_mask=True)
    assert (plan.inputs, plan.mask) == (("x",), "mask")


def test_query_key_and_value_all_get_the_input():
    plan = plan_call(cm.QueryKeyValue(), takes_mask=True)
    assert (plan.inputs, plan.mask) == (("query", "key", "value"), "attn_mask")


@pytest.mark.parametrize(
    ("params", "inputs"),
    [
        (("values", "keys", "query", "mask"), ("values", "keys", "query")),  # Aladdin Persson's
        (("q", "k", "v", "mask"), ("q", "k", "v")),
        (("queries", "keys", "values"), ("queries", "keys", "values")),
        (("query", "key", "mask"), None),  # no value: not a (q, k, v) forward
        (("q", "query", "k", "v"), None),  # two queries: which one is not said
        (("q", "query", "k"), None),  # and no value
    ],
)
def test_query_key_and_value_are_read_by_role_singular_or_plural(params, inputs):
    assert qkv_inputs(params) == inputs


def test_an_argument_the_doctor_cannot_make_is_named_in_one_line():
    with pytest.raises(UsageError, match=r"it needs kv_cache, which the doctor cannot make"):
        plan_call(cm.NeedsCache(), takes_mask=True)


@pytest.mark.parametrize("module", [cm.MetaRotary, cm.TransformersRotary])
def test_rotary_tables_are_made_in_the_form_the_forward_names_and_mark_it_positional(module):
    d = diagnose(module(32, 4), Config())
    found = {f.probe: f for f in d.findings}
    assert d.healthy, d.text()
    assert "rotary" in found["permutation equivariance"].message, d.text()


def test_a_declared_mask_needs_a_mask_parameter():
    with pytest.raises(UsageError, match=r"cannot be called as forward\(x, mask\): no parameter"):
        plan_call(cm.NoMaskParameter(), takes_mask=True)


def test_the_input_width_is_one_the_module_runs_on_not_the_first_guess():
    d = diagnose(cm.MisleadingDim(32, 4), Config())
    assert d.healthy, d.text()


@pytest.mark.parametrize(
    ("module", "words"),
    [
        (cm.CrossInputFirst(32, 4), "keep (True = attend) (B, T, T)"),
        (cm.KeyPaddingDrop(32, 4), "drop (True = blocked, as nn.MultiheadAttention) key padding"),
        (torch.nn.MultiheadAttention(32, 4, batch_first=True), "drop (True = blocked"),
    ],
)
def test_an_undeclared_mask_convention_is_detected_and_said(module, words):
    d = diagnose(module, Config())
    found = {f.probe: f for f in d.findings}
    assert found["mask convention"].status == "pass" and words in found["mask convention"].message
    assert found["padding no-leak"].status == "pass", d.text()
    assert d.healthy, d.text()


def test_a_mask_that_changes_nothing_is_a_failure_not_a_skip():
    d = diagnose(cm.IgnoresItsMask(32, 4), Config())
    found = {f.probe: f for f in d.findings}
    assert found["mask convention"].status == "fail", d.text()
    assert "the same, bit for bit, with a mask as without" in found["mask convention"].message
    assert "as if dropped: causal_leak (" in found["mask convention"].message
    assert not d.healthy


def test_a_declared_convention_is_not_second_guessed():
    d = diagnose(cm.CrossInputFirst(32, 4), Config(mask="keep"))
    assert "mask convention" not in {f.probe for f in d.findings}


def test_a_mask_read_right_for_padding_but_leaking_the_future_gets_no_convention():
    d = diagnose(cm.LastRowOnly(32, 4), Config())
    found = {f.probe: f for f in d.findings}
    assert found["mask convention"].status == "fail", d.text()
    # it reads its mask, wrongly: not called ignored
    assert "ignored or broken" in found["mask convention"].message, d.text()


def test_a_module_that_masks_the_future_itself_is_probed_as_causal_and_says_where():
    d = diagnose(dm.SelfAttention(32, 4), Config())  # its name says nothing; its forward does
    found = {f.probe: f for f in d.findings}
    assert "it masks the future itself at " in found["causality"].message, d.text()
    assert found["permutation equivariance"].status == "skip" and d.healthy, d.text()


def test_a_module_that_looks_ahead_is_shown_the_leak_before_positions_are_offered():
    """An encoder's layer (is_causal = False) whose band lets key t + 1 through: its flag
    outranks its forward, so it is not probed as causal and the permutation probe shows the
    look-ahead before offering --positions."""
    module = dm.EncoderSelfAttention(32, 4, diagonal=1)
    found = {f.probe: f for f in diagnose(module, Config()).findings}
    message = found["permutation equivariance"].message
    assert found["permutation equivariance"].status == "fail"
    assert "output at position 0 depends on input 1" in message
    assert message.index("depends on input") < message.index("--positions")


def test_a_module_that_hard_codes_float32_runs_in_float32():
    d = diagnose(cm.Float32Scores(32, 4), Config())
    assert d.healthy, d.text()
    assert Subject(cm.Float32Scores(32, 4), Config()).dtype == torch.float32
    assert Subject(cm.Heads(32, 4), Config()).dtype == torch.float64


def test_shapes_stay_within_the_context_the_module_declares():
    d = diagnose(cm.ShortContext(32, 4, block_size=16), Config(causal=True))
    found = {f.probe: f for f in d.findings}
    assert d.healthy, d.text()
    assert "up to its context, 16" in found["shape contract"].message
    assert "seq_len == d_model" not in found["shape contract"].message


def test_a_second_output_that_is_not_a_distribution_is_not_taken_for_weights():
    d = diagnose(cm.ReturnsLogits(32, 4), Config())
    found = {f.probe: f for f in d.findings}
    assert d.healthy, d.text()
    assert found["attention weights"].status == "skip"


def test_a_sequence_first_module_is_run_as_one_when_told_and_pointed_there_when_not():
    told = diagnose(cm.SequenceFirst(32, 4), Config(sequence_first=True))
    assert told.healthy, told.text()
    assert "drop (True = blocked" in told.findings[0].message  # its key padding mask, detected
    found = {f.probe: f for f in diagnose(cm.SequenceFirst(32, 4), Config()).findings}
    mixing = found["batch independence"]
    assert mixing.status == "fail" and "pass --sequence-first" in mixing.message, mixing


def test_a_module_that_says_batch_first_false_is_run_sequence_first():
    module = cm.SequenceFirst(32, 4)
    module.batch_first = False
    d = diagnose(module, Config())
    assert d.healthy, d.text()


def test_a_causal_module_that_ignores_its_padding_mask_is_caught_by_left_padding():
    """Padding at the end is never visible to a causal module's real tokens; at the start it is."""
    d = diagnose(cm.CausalIgnoresPadding(32, 4), Config(causal=True))
    assert not d.healthy, d.text()
    assert d.findings[0].probe == "mask convention" and d.findings[0].status == "fail"


def test_of_several_mask_parameters_the_one_that_works_is_found_and_can_be_named():
    d = diagnose(cm.TwoMasks(32, 4), Config())
    assert d.healthy, d.text()
    assert "`key_padding_mask`" in d.findings[0].message
    assert "--mask-arg key_padding_mask" in d.findings[0].message
    told = diagnose(cm.TwoMasks(32, 4), Config(mask_arg="attn_mask"))
    assert not told.healthy  # attn_mask is ignored: no reading of it stops a leak
    with pytest.raises(UsageError, match="--mask-arg nope: forward has no parameter"):
        diagnose(cm.TwoMasks(32, 4), Config(mask="drop", mask_arg="nope"))


@pytest.mark.parametrize(("mask_arg", "shape"), [("key_padding_mask", "bk"), ("attn_mask", "bqk")])
def test_nn_multihead_attentions_own_mask_parameters_can_be_named(mask_arg, shape):
    """torch's own layer takes key_padding_mask and attn_mask; naming either is what its
    users write (gluonts' TFT hands key_padding_mask), and its mask goes where its shape says."""
    module = torch.nn.MultiheadAttention(32, 4, batch_first=True)
    config = Config(mask="drop", mask_shape=shape, mask_arg=mask_arg)
    assert diagnose(module, config).healthy
    with pytest.raises(UsageError, match="--mask-arg need_weights: forward has no parameter"):
        diagnose(module, Config(mask="drop", mask_arg="need_weights"))


def test_rotary_modules_are_compared_with_sdpa_under_the_same_rope_and_tiled_heads_fail():
    found = {f.probe: f for f in diagnose(cm.RotaryGQA(32, 4, 2), Config()).findings}
    assert found["agrees with SDPA"].status == "pass", found["agrees with SDPA"]
    assert "RoPE (half)" in found["agrees with SDPA"].message
    blocks = Config(kv_grouping="blocks")  # a Llama-style checkpoint's layout, declared
    tiled = {f.probe: f for f in diagnose(cm.RotaryGQA(32, 4, 2, tile=True), blocks).findings}
    assert (
        tiled["agrees with SDPA"].status == "fail" and "tiled" in tiled["agrees with SDPA"].message
    )
    undeclared = diagnose(cm.RotaryGQA(32, 4, 2, tile=True), Config()).findings
    sdpa = next(f for f in undeclared if f.probe == "agrees with SDPA")
    assert sdpa.status == "pass" and "strided grouping" in sdpa.message, sdpa


CAUSAL = Config(causal=True)


def _sdpa(module, config=None):
    d = diagnose(module, config or Config())
    return d, {f.probe: f for f in d.findings}["agrees with SDPA"]


def test_partial_rotary_read_off_the_module_is_compared_on_the_dimensions_it_turns():
    d, found = _sdpa(cm.PartialRotary(32, 4), CAUSAL)
    assert found.status == "pass" and "on 4 dims a head" in found.message, d.text()


def test_a_whole_head_rotation_where_the_module_says_partial_fails_the_comparison():
    d, found = _sdpa(cm.PartialRotary(32, 4, whole=True), CAUSAL)
    assert found.status == "fail" and not d.healthy, d.text()


def test_declared_rotary_dims_beat_a_whole_head_rotation():
    module = cm.PartialRotary(32, 4, whole=True)
    del module.rotary_ndims  # it says nothing: only the declaration knows
    _, undeclared = _sdpa(module, CAUSAL)
    d, declared = _sdpa(module, Config(causal=True, rotary_dims=4))
    assert undeclared.status == "pass" and declared.status == "fail", d.text()


@pytest.mark.parametrize("per_group", [False, True])
def test_fused_grouped_projections_are_read_in_either_real_layout(per_group):
    d, found = _sdpa(cm.FusedGrouped(32, 4, 2, per_group))
    layout = "per K/V group" if per_group else "q | k | v"
    assert found.status == "pass" and layout in found.message, d.text()
    assert d.healthy, d.text()


def test_a_residual_around_attention_is_compared_before_it_not_failed_for_it():
    d, found = _sdpa(cm.Residual(32, 4), Config(mask="keep"))
    assert found.status == "pass" and "input of its output projection `o_proj`" in found.message
    assert d.healthy, d.text()


def test_a_residual_does_not_hide_a_wrong_scale_inside():
    d, found = _sdpa(cm.ResidualWrongScale(32, 4))
    assert found.status == "fail", d.text()


def test_an_additive_fill_is_float32s_lowest_so_a_float32_softmax_keeps_a_keyless_row_finite():
    d = diagnose(cm.UpcastSoftmax(32, 4), Config(mask="additive"))
    found = {f.probe: f for f in d.findings}["all-masked rows"]
    assert found.status == "pass" and d.healthy, d.text()


@pytest.mark.parametrize("per_head", [True, False])
def test_query_and_key_norms_are_part_of_the_reading_so_the_scale_is_still_checked(per_head):
    d, found = _sdpa(cm.QKNorm(32, 4, per_head))
    assert found.status == "pass" and "q_norm, k_norm" in found.message and d.healthy, d.text()
    d, found = _sdpa(cm.QKNorm(32, 4, per_head, twice=True))
    assert found.status == "fail" and "double_scale" in found.message, d.text()


def test_a_softcap_read_off_the_module_caps_the_reference_and_after_the_mask_is_named():
    d, found = _sdpa(cm.Softcapped(32, 4), Config(mask="keep"))
    assert found.status == "pass" and "scores capped at 5" in found.message, d.text()
    d, found = _sdpa(cm.Softcapped(32, 4, after=True), Config(mask="keep"))
    assert found.status == "fail" and "softcap_after_mask" in found.message, d.text()


def test_a_cap_after_the_mask_that_leaks_only_at_large_logits_is_named_softcap_after_mask():
    d = diagnose(cm.Softcapped(32, 4, after=True, cap=50.0), Config(mask="keep"))
    found = {f.probe: f for f in d.findings}["causal no-leak"]
    assert found.status == "fail" and "scaled by" in found.message, d.text()
    assert "softcap_after_mask" in found.message and "fill_too_small" not in found.message
    d = diagnose(cm.Softcapped(32, 4, cap=50.0), Config(mask="keep"))
    assert {f.probe: f for f in d.findings}["causal no-leak"].status == "pass", d.text()


def test_a_rotary_module_capping_after_its_mask_is_named_not_skipped_as_other_rotary():
    d, found = _sdpa(cm.RotarySoftcapped(32, 4), Config(mask="keep"))
    assert found.status == "pass" and "scores capped at 5" in found.message, d.text()
    d, found = _sdpa(cm.RotarySoftcapped(32, 4, after=True), Config(mask="keep"))
    assert found.status == "fail" and "softcap_after_mask" in found.message, d.text()


def test_cross_attention_multihead_is_one_usage_line():
    module = torch.nn.MultiheadAttention(32, 4, kdim=16, vdim=24, batch_first=True)
    with pytest.raises(UsageError, match=r"is cross-attention: its keys and values"):
        diagnose(module, Config(mask="drop"))


@pytest.mark.parametrize("module", [cm.TransformersRotary, cm.InterleavedOnHalfTables])
def test_pairing_other_than_the_tables_is_named_by_tables_laid_out_in_pairs(module):
    d = diagnose(module(32, 4), Config(causal=True))
    shift = {f.probe: f for f in d.findings}["position shift"]
    if module is cm.TransformersRotary:
        assert shift.status == "pass", d.text()
    else:
        assert shift.status == "fail" and "(rope_pairing_mismatch)" in shift.message, d.text()


def test_the_tables_the_doctor_makes_and_its_reference_share_the_modules_rope_base():
    module = cm.TransformersRotary(32, 4)
    module.rope_theta = 1e6  # what a transformers layer's config says (Qwen2's)
    d, found = _sdpa(module, Config(causal=True))
    assert found.status == "pass" and "RoPE" in found.message, d.text()


def test_an_adapter_says_what_it_knows_as_attributes_read_in_one_place():
    from harness.doctor import adapters
    from harness.doctor.protocol import Adapter

    plain = Adapter(None)
    assert (plain.kv_grouping, plain.from_model, plain.context, plain.make_cache()) == (
        "auto", False, None, None)  # fmt: skip

    def call(module, x, *, positions, mask, cache):
        return module(x)

    call.kv_grouping, call.context, call.unused_by_model = "blocks", 64, ["w"]
    said = Adapter(call)
    assert (said.kv_grouping, said.context, said.unused_by_model) == ("blocks", 64, {"w"})
    assert Adapter(adapters.x_transformers).make_cache() is adapters.XCache  # its own


class OwnRotaryObject(dm.SelfAttention):
    """MEGABYTE's form: an optional ``rotary_emb`` it reads as an object (``.cos``), not the
    (cos, sin) tables the doctor makes; left None, it runs."""

    def forward(self, x, rotary_emb=None):
        if rotary_emb is not None:
            x = x * rotary_emb.cos
        return super().forward(x)


def test_an_optional_table_in_another_form_is_left_to_its_default():
    d = diagnose(OwnRotaryObject(32, 4), Config(positions="none"))
    assert d.healthy, d.text()


def test_a_sequence_first_module_gets_its_positions_batch_first():
    """(T, B, C) activations, (B, T) positions: the doctor counts the positions along the
    tokens, not along the batch (which left the rotation the same for every token, and the
    module position-blind)."""
    config = Config(sequence_first=True, causal=True, positions="relative")
    d = diagnose(cm.SequenceFirstRotary(64, 4), config)
    assert d.healthy, d.text()
    found = {f.probe: f for f in d.findings}
    assert found["token order"].status == "pass", found["token order"].message
