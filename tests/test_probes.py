"""The doctor's probes one at a time, each on a module built to trip it (or to pass it).

A probe is run exactly as ``diagnose`` runs it (``examine`` under the config's seed), so a test
costs one probe, not the whole diagnosis. The last tests run every probe in other orders.
"""

import importlib
import random
import re
from dataclasses import replace

import pytest
import torch
from torch import nn

from harness.catalogue.registry import load
from harness.doctor import FAIL, PASS, SKIP, WARN, Config, diagnose
from harness.doctor.examine import examine
from harness.doctor.probes import PROBES
from harness.doctor.subject import Subject
from harness.errors import UsageError
from harness.runner import seeded
from harness.validation import DOCTOR_SHAPE, config_for
from tests import call_modules as cm
from tests import doctor_modules as dm
from tests import misbehaving_modules as mm

KEEP = Config(mask="keep")
LARGE = "with activations scaled by 300"
FILL = "fill_too_small (fill with -inf, or torch.finfo(dtype).min)"


def make(factory, *args, **kwargs) -> nn.Module:
    """A module built under seed 0, without touching the global RNG."""
    with seeded(0):
        return factory(*args, **kwargs)


def catalogue(pitfall: str, side: str = "buggy") -> tuple[nn.Module, Config]:
    """A catalogue module at the doctor's shape, with the options its user would pass."""
    pair = load(pitfall)
    module = make(pair.card.build, pair.buggy if side == "buggy" else pair.fixed, DOCTOR_SHAPE)
    return module, config_for(pair.card)


def probe(module: nn.Module, config: Config, name: str):
    """One probe's finding, as ``diagnose`` makes it."""
    with seeded(config.seed):
        return examine(name, PROBES[name], Subject(module, config))


# --- agrees with SDPA --------------------------------------------------------------------------


CORRECT = {  # correct modules, each with the options that describe it
    "einsum_keep": (dm.einsum_ok, KEEP),
    "gpt_causal": (dm.gpt_ok, Config(causal=True)),
    "key_padding_causal": (
        lambda d, h: dm.KeyPadding(d, h, causal=True),
        Config(mask="keep", mask_shape="bk", causal=True),
    ),
}


@pytest.mark.parametrize("case", CORRECT)
def test_correct_modules_agree_with_sdpa(case):
    """SDPA gets the mask passed and, for a causal module, the causal one too."""
    factory, config = CORRECT[case]
    f = probe(make(factory, 64, 4), config, "agrees with SDPA")
    assert f.status == PASS, f


def test_a_slightly_wrong_scale_disagrees_with_sdpa():
    f = probe(make(dm.einsum_nearly_scaled, 64, 4), KEEP, "agrees with SDPA")
    assert f.status == FAIL and "max |output - SDPA|" in f.message, f
    diff = float(re.search(r"= ([0-9.e+-]+) on", f.message).group(1))
    assert 1e-6 < diff < 1e-2  # off by a small relative amount, not by a mile


@pytest.mark.parametrize(
    ("pitfall", "words"),
    [
        ("scale_d_model", "a 1/sqrt(d_model) scale"),
        ("softmax_dim", "softmax over the batch"),
        ("missing_scale", "no scale at all"),
    ],
)
def test_a_disagreement_names_the_catalogue_trap_it_reproduces(pitfall, words):
    f = probe(*catalogue(pitfall), "agrees with SDPA")
    assert f.status == FAIL and f"behaves like {words}" in f.message, f
    assert f.message.endswith(f": {pitfall}"), f


def test_a_disagreement_no_trap_explains_names_no_far_off_trap():
    """A scale 0.1% off: no known wrong form explains even half of it, so none is named."""
    f = probe(make(dm.einsum_nearly_scaled, 64, 4), KEEP, "agrees with SDPA")
    assert f.status == FAIL and "no known trap's arithmetic comes near it" in f.message, f
    assert "nearest" not in f.message


def test_a_near_miss_of_a_known_trap_names_it_with_its_distance():
    """1/sqrt(1.1 d_model): most of the way to scale_d_model, not within the floor."""
    module = make(dm.EinsumAttention, 64, 4, scale_by=1.1 * 64)
    f = probe(module, KEEP, "agrees with SDPA")
    assert "no known trap matches (nearest: a 1/sqrt(d_model) scale, scale_d_model" in f.message, f


def test_sdpa_tolerance_is_relative_to_the_output_scale():
    """Outputs near 1e12 carry float64 rounding near 1e-4: still agreement."""
    f = probe(make(dm.einsum_huge_output, 64, 4), KEEP, "agrees with SDPA")
    assert f.status == PASS, f


def test_nan_rows_disagree_with_sdpa():
    """padding_on_queries blocks padded rows: NaN there, where SDPA is finite."""
    module, config = catalogue("padding_on_queries")
    f = probe(module, config, "agrees with SDPA")
    assert f.status == FAIL and "= inf" in f.message, f
    assert probe(*catalogue("padding_on_queries", "fixed"), "agrees with SDPA").status == PASS


# --- shape contract, batch independence, permutation, weights, gradients -----------------------


def test_shape_contract_tries_a_single_token():
    f = probe(make(dm.SqueezedScores, 64, 4), Config(), "shape contract")
    assert f.status == FAIL and "seq_len 1" in f.message, f


def test_shape_contract_reads_the_width_of_a_fused_projection():
    f = probe(make(dm.gpt_ok, 64, 4), Config(causal=True), "shape contract")
    assert f.status == PASS, f


def test_batch_independence_names_the_sequence_that_leaks():
    f = probe(make(dm.NeighbourKeys, 64, 4), Config(), "batch independence")
    assert f.status == FAIL and "output of sequence 0 depends on sequence 2:" in f.message, f


@pytest.mark.parametrize("heads", [1, 4])
def test_weights_of_a_correct_module_pass(heads):
    """Weights (B, T, T) from one head and (B, h, T, T) from several, under a causal mask."""
    if heads == 1:
        module, config = catalogue("mask_bool", "fixed")
    else:
        module, config = make(dm.einsum_ok, 64, heads), KEEP
    f = probe(module, config, "attention weights")
    assert f.status == PASS, f


def test_rows_that_sum_to_0_999_are_not_distributions():
    f = probe(make(dm.EpsSoftmax, 64, 4), KEEP, "attention weights")
    assert f.status == FAIL and "not distributions" in f.message, f


def test_a_masked_module_is_permutation_equivariant():
    f = probe(make(dm.einsum_ok, 64, 4), KEEP, "permutation equivariance")
    assert f.status == PASS, f


def test_positions_break_permutation_unless_declared():
    module = make(dm.LearnedPositions, 64, 4)
    f = probe(module, KEEP, "permutation equivariance")
    assert f.status == FAIL and "--positions relative" in f.message, f
    declared = Config(mask="keep", positions="absolute")
    assert probe(module, declared, "permutation equivariance").status == SKIP


def test_a_dead_key_bias_is_said_and_passes_since_softmax_ignores_it():
    f = probe(*catalogue("qkv_bias"), "gradient flow")
    assert f.status == PASS and "but W_k.bias, a key bias, which softmax ignores" in f.message, f
    assert probe(*catalogue("qkv_bias", "fixed"), "gradient flow").status == PASS


def test_a_dead_bias_beside_a_dead_weight_is_dead_weight_not_a_cancelled_key_bias():
    class UnusedLayer(torch.nn.Module):  # an extra layer whose output is thrown away
        def __init__(self, d_model, n_heads):
            super().__init__()
            self.attn, self.extra = dm.EinsumAttention(d_model, n_heads), torch.nn.Linear(8, 8)

        def forward(self, x, mask=None):
            out, weights = self.attn(x, mask)
            return out + 0.0 * self.extra(x[..., :8]).sum(), weights

    f = probe(make(UnusedLayer, 64, 4), Config(), "gradient flow")
    assert f.status == WARN and "extra.weight, extra.bias" in f.message, f


def test_no_gradient_to_any_parameter_is_dead_weight_not_health():
    f = probe(make(dm.SwitchedOffBranch, 64, 4), Config(), "gradient flow")
    assert f.status == WARN and "dead weight: attn.q.weight, attn.k.weight" in f.message, f


# --- leaks -------------------------------------------------------------------------------------


def test_padding_leak_names_the_padded_input_it_reads():
    """The last key is never masked: the leak is from input 7, which is padding there."""
    f = probe(make(dm.LastKeyUnmasked, 64, 4), KEEP, "padding no-leak")
    assert f.status == FAIL, f
    pattern = r"real output \d+ of sequence (\d+) depends on padded input (\d+):"
    match = re.search(pattern, f.message)
    assert match and int(match.group(1)) > 0 and int(match.group(2)) == 7, f


@pytest.mark.parametrize("name", ["causal no-leak", "padding no-leak"], ids=["causal", "padding"])
def test_a_small_additive_fill_leaks_only_at_large_logits(name):
    """BERT's (1 - mask) * -10000 hides a key on ordinary inputs, not at large logits."""
    assert probe(make(dm.einsum_ok, 64, 4), KEEP, name).status == PASS
    f = probe(make(dm.BertAdditive, 64, 4), KEEP, name)
    assert f.status == FAIL and LARGE in f.message and f.message.endswith(FILL), f
    assert "fill_too_small" in f.message


def test_an_inverted_convention_gets_a_hint_either_way():
    keep_module = probe(make(dm.einsum_ok, 64, 4), Config(mask="drop"), "causal no-leak")
    assert keep_module.status == FAIL and "passes with --mask keep" in keep_module.message
    drop_module = probe(make(dm.wrapper_ok, 32, 4), KEEP, "causal no-leak")
    assert drop_module.status == FAIL and "passes with --mask drop" in drop_module.message


def test_a_mask_that_works_only_the_other_way_round_names_mask_bool():
    f = probe(*catalogue("mask_bool"), "causal no-leak")
    assert f.status == FAIL and "passes with --mask drop" in f.message, f
    assert "mask_bool" in f.message and "sdpa_mask_inverted" in f.message


def test_a_real_leak_gets_no_convention_hint():
    f = probe(make(dm.LastKeyUnmasked, 64, 4), KEEP, "causal no-leak")
    assert f.status == FAIL and "depends on input 7" in f.message, f
    assert "passes with" not in f.message


def test_a_key_padding_module_is_not_probed_for_causality():
    config = Config(mask="keep", mask_shape="bk")
    assert probe(make(dm.KeyPadding, 64, 4), config, "causal no-leak").status == SKIP
    assert probe(make(dm.KeyPadding, 64, 4), config, "padding no-leak").status == PASS


def test_nan_for_an_all_padding_sequence_is_a_warning():
    f = probe(make(dm.einsum_ok, 64, 4), KEEP, "all-masked rows")
    assert f.status == WARN and "no allowed key gives NaN" in f.message, f


# --- numerics ----------------------------------------------------------------------------------


def test_dropout_left_on_in_eval_fails_determinism():
    f = probe(*catalogue("dropout_in_eval"), "eval determinism")
    assert f.status == FAIL and "dropout" in f.message, f
    assert probe(*catalogue("dropout_in_eval", "fixed"), "eval determinism").status == PASS


def test_an_input_changed_in_place_is_named_not_taken_for_dropout():
    f = probe(make(mm.ChangesItsInput, 16), Config(d_model=16), "eval determinism")
    assert f.status == FAIL and "changes its input tensor in place" in f.message, f
    assert "dropout" not in f.message, f
    assert probe(make(mm.Plain, 16), Config(d_model=16), "eval determinism").status == PASS


@pytest.mark.parametrize("name", ["eval determinism", "gradient flow"])
def test_a_module_whose_outputs_are_all_nan_fails_what_it_cannot_pass(name):
    f = probe(make(mm.AllNaN, 16), Config(d_model=16), name)
    assert f.status == FAIL and "NaN" in f.message, f


COMPARING = ["cached decoding", "grouped heads", "position shift", "token order", "left padding",
             "packed documents", "sliding window"]  # fmt: skip


@pytest.mark.parametrize("name", COMPARING)
def test_dropout_left_on_skips_every_probe_that_compares_two_calls(name):
    module, config = catalogue("dropout_in_eval")
    f = probe(module, replace(config, positions="relative", window=3, packed=True), name)
    assert f.status == SKIP and "not deterministic in eval mode" in f.message, f


@pytest.mark.parametrize("name", ["float16 robustness", "bfloat16 robustness"])
def test_dropout_left_on_is_said_once_not_again_as_low_precision_error(name):
    f = probe(*catalogue("dropout_in_eval"), name)
    assert f.status == SKIP and "eval determinism" in f.message, f
    assert probe(*catalogue("dropout_in_eval", "fixed"), name).status != SKIP


def test_a_module_in_training_mode_is_probed_in_eval_mode():
    module = make(nn.MultiheadAttention, 32, 4, dropout=0.5).train()
    assert probe(module, Config(mask="drop"), "eval determinism").status == PASS
    assert module.training


def test_float16_overflow_before_the_scale_fails_a_module_declared_to_run_in_float16():
    module, config = catalogue("qk_overflow_half")
    assert config.dtype == "float16"  # what the card's user knows
    f = probe(module, config, "float16 robustness")
    assert f.status == FAIL and "qk_overflow_half" in f.message, f
    assert probe(module, config, "bfloat16 robustness").status == PASS
    fixed = probe(*catalogue("qk_overflow_half", "fixed"), "float16 robustness")
    assert fixed.status == PASS and "qk_overflow_half" not in fixed.message, fixed


def test_textbook_float16_overflow_is_a_note_not_a_warning_unless_float16_is_declared():
    """Most correct code computes (Q K^T) / sqrt(d): a warning there would fire on all of it."""
    module, config = catalogue("qk_overflow_half")
    f = probe(module, replace(config, dtype="float32"), "float16 robustness")
    assert f.status == PASS and "declare --dtype float16" in f.message, f
    textbook, fixed_config = catalogue("mask_bool", "fixed")
    f = probe(textbook, fixed_config, "float16 robustness")
    assert f.status == PASS, f


def test_a_module_worse_than_sdpa_in_bfloat16_fails():
    """Adding 256 and taking it away is exact in float64; in bfloat16 it rounds the output to
    steps of 2, far beyond SDPA's own bfloat16 error on the same projections."""
    module = make(dm.einsum_ok, 64, 4)
    module.register_forward_hook(lambda m, args, out: ((out[0] + 256) - 256, out[1]))
    f = probe(module, KEEP, "bfloat16 robustness")
    assert f.status == FAIL and "beyond 2x the floor" in f.message, f
    assert probe(make(dm.einsum_ok, 64, 4), KEEP, "bfloat16 robustness").status == PASS


def test_an_error_in_float16_only_is_a_failure_where_it_runs_in_float16():
    module, undeclared_config = catalogue("fill_overflow_half")
    config = replace(undeclared_config, dtype="float16")  # its user says it runs in float16
    f = probe(module, config, "float16 robustness")
    assert f.status == FAIL and f.message.startswith("raises under torch.autocast"), f
    assert "fill_overflow_half" in f.message
    assert probe(module, config, "bfloat16 robustness").status == PASS
    # undeclared, a -1e9 fill that is right in float32 (the Annotated Transformer's) is a warning
    undeclared = probe(module, replace(config, dtype="float32"), "float16 robustness")
    assert undeclared.status == WARN and "fill_overflow_half" in undeclared.message, undeclared


# --- the subject -------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [dict(batch=1), dict(seq_len=2)], ids=["batch", "seq_len"])
def test_config_refuses_sizes_the_probes_cannot_use(options):
    with pytest.raises(UsageError):
        Config(**options)
    Config(batch=2, seq_len=3)  # the smallest that works


def test_a_module_written_x_at_w_is_called_with_its_input_width():
    d = diagnose(make(dm.MatmulParameters, 64, 4), Config(d_model=64))
    assert d.healthy, d.text()


def test_sequence_first_multihead_attention_is_called_the_right_way():
    module = make(nn.MultiheadAttention, 32, 4)  # batch_first=False: (T, B, E)
    config = Config(mask="drop")
    for name in ("batch independence", "padding no-leak", "agrees with SDPA"):
        f = probe(module, config, name)
        assert f.status == PASS, f


# --- probe order -------------------------------------------------------------------------------

ORDER_CASES = {  # name -> () -> (module, config)
    "einsum_ok": lambda: (make(dm.einsum_ok, 32, 4), KEEP),
    "gpt_leaky": lambda: (make(dm.gpt_leaky, 32, 4), Config(causal=True)),
    "wrapper_no_transpose": lambda: (make(dm.wrapper_no_transpose, 32, 4), Config()),
    "inverted_convention": lambda: (make(dm.wrapper_ok, 32, 4), KEEP),
    "qk_overflow_half": lambda: catalogue("qk_overflow_half"),
    "huge_output": lambda: (make(dm.einsum_huge_output, 32, 4), KEEP),  # inf in float16
}


def _orders() -> dict[str, list[str]]:
    names = list(PROBES)
    shuffled = names.copy()
    random.Random(0).shuffle(shuffled)
    return {"reversed": names[::-1], "shuffled": shuffled}


def _diagnose_in_order(monkeypatch, module, config, order):
    examine_module = importlib.import_module("harness.doctor.examine")
    monkeypatch.setattr(examine_module, "PROBES", {name: PROBES[name] for name in order})
    d = diagnose(module, config)
    monkeypatch.undo()
    assert [f.probe for f in d.findings if f.probe in PROBES] == order
    return {f.probe: f for f in d.findings}


@pytest.mark.parametrize("case", ORDER_CASES)
def test_probe_order_does_not_matter(monkeypatch, case):
    expected = {f.probe: f for f in diagnose(*ORDER_CASES[case]()).findings}
    for label, order in _orders().items():
        found = _diagnose_in_order(monkeypatch, *ORDER_CASES[case](), order)
        assert found == expected, label


def test_probe_order_does_not_change_a_random_modules_verdicts(monkeypatch):
    module, config = catalogue("dropout_in_eval")
    expected = {f.probe: f.status for f in diagnose(module, config).findings}
    for order in _orders().values():
        found = _diagnose_in_order(monkeypatch, module, config, order)
        assert {name: f.status for name, f in found.items()} == expected


def test_probe_order_does_not_change_a_random_modules_evidence(monkeypatch):
    module, config = catalogue("dropout_in_eval")
    expected = {f.probe: f for f in diagnose(module, config).findings}
    found = _diagnose_in_order(monkeypatch, module, config, list(PROBES)[::-1])
    assert found == expected


def test_float16_overflow_that_scaling_first_shares_is_the_range_not_the_module():
    """nn.MultiheadAttention scales Q first; where even that overflows, it is float16's range."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(64, 4, batch_first=True)
    f = probe(mha, Config(mask="drop", mask_shape="bk"), "float16 robustness")
    assert f.status == PASS, f


@pytest.mark.parametrize("pitfall", ["head_split_view", "head_merge_no_transpose"])
def test_heads_split_or_merged_without_the_transpose_are_named_by_their_fit(pitfall):
    f = probe(*catalogue(pitfall), "agrees with SDPA")
    assert f.status == FAIL and f"(within 0): {pitfall}" in f.message, f
    assert probe(*catalogue(pitfall, "fixed"), "agrees with SDPA").status == PASS


@pytest.mark.parametrize("causal", [True, False])
def test_masked_keys_sharing_one_weight_name_a_cap_after_the_mask(causal):
    """Capping after the mask squashes every fill to -cap, so a row's masked keys share one
    weight: named softcap_after_mask, not the causal leak it also is; a cap before the mask
    leaves them none, and a mask never applied leaves each its own (the leak named)."""
    config = Config(mask="keep", causal=causal)
    after = probe(cm.SoftcappedWithWeights(32, 4, after=True), config, "attention weights")
    assert after.status == FAIL and after.message.endswith("then mask them)"), after
    assert "squashed to -5 " in after.message and "causal_leak" not in after.message, after
    before = probe(cm.SoftcappedWithWeights(32, 4), config, "attention weights")
    assert before.status == PASS, before
    dropped = probe(make(dm.MaskNeverUsed, 32, 4), config, "attention weights")
    assert dropped.status == FAIL and "softcap_after_mask" not in dropped.message, dropped


def test_a_mask_one_diagonal_off_is_named_even_where_causal_is_not_declared():
    """Without --causal a positional module skips the permutation probe that would point to
    it; the one-ahead shape of tril(diagonal=1) is named all the same, and only that shape."""
    leaky = probe(dm.gpt_leaky(32, 4), Config(), "causal no-leak")
    assert leaky.status == FAIL and "(causal_leak: tril(diagonal=1)" in leaky.message, leaky
    assert probe(dm.gpt_ok(32, 4), Config(), "causal no-leak").status == SKIP
    both_ways = make(dm.MaskNeverUsed, 32, 4)
    assert probe(both_ways, Config(mask="none"), "causal no-leak").status == SKIP


def test_weight_on_a_later_key_names_the_causal_leak():
    """The weights probe fails first in the table: where its masked weight lies on later keys
    of a causal module, it names the leak itself (a mask never applied)."""
    module = make(dm.MaskNeverUsed, 32, 4)
    causal = probe(module, Config(mask="keep", causal=True), "attention weights")
    assert causal.status == FAIL and causal.message.endswith("(causal_leak)"), causal
    padding = probe(module, KEEP, "attention weights")
    assert padding.status == FAIL and "causal_leak" not in padding.message, padding
