"""The doctor on modules it has never seen, its command line, and its promises."""

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from harness import cli
from harness.doctor import FAIL, PASS, SKIP, STEPS, WARN, Config, Diagnosis, Finding, diagnose
from harness.doctor.causes import explain
from harness.doctor.probes.unmasked import unmasked_at
from harness.doctor.subject import Subject
from harness.reference import recognize
from pitfalls.padding_on_queries import buggy as on_queries_buggy
from pitfalls.padding_on_queries import fixed as on_queries_fixed
from tests import call_modules as cm
from tests import doctor_modules as dm
from tests.test_probes import catalogue
from tests.test_probes import make as seeded_build

MODULES = "tests/doctor_modules.py"

CORRECT = [
    ("einsum_ok", Config(mask="keep")),
    ("gpt_ok", Config(causal=True)),
    ("wrapper_ok", Config(mask="drop")),
]
BUGGY = [  # (factory, config, probe that must fail, words its message must contain)
    ("einsum_wrong_axis", Config(mask="keep"), "attention weights", "not distributions"),
    ("einsum_wrong_scale", Config(mask="keep"), "agrees with SDPA", "max |output - SDPA|"),
    ("gpt_leaky", Config(causal=True), "causal no-leak", "depends on input"),
    ("wrapper_no_transpose", Config(), "batch independence", "depends on sequence"),
]


@pytest.mark.parametrize(("factory", "config"), CORRECT)
def test_correct_modules_are_healthy(factory, config):
    d = diagnose(getattr(dm, factory)(64, 4), config, factory)
    assert d.healthy, d.text()


@pytest.mark.parametrize(("factory", "config", "probe", "words"), BUGGY)
def test_buggy_modules_fail_the_probe_that_points_at_the_bug(factory, config, probe, words):
    d = diagnose(getattr(dm, factory)(64, 4), config, factory)
    assert not d.healthy
    failed = {f.probe: f.message for f in d.findings if f.status == FAIL}
    assert probe in failed and words in failed[probe], d.text()


def test_diagnosis_leaves_the_module_alone():
    torch.manual_seed(0)
    module = dm.SeqFirstWrapper(32, 4).train()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    rng = torch.get_rng_state()
    diagnose(module, Config(mask="drop"))
    assert module.training
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert torch.equal(rng, torch.get_rng_state())
    assert all(p.grad is None for p in module.parameters())


def test_strict_turns_warnings_into_failures():
    module = nn.MultiheadAttention(32, 4, batch_first=True)  # NaN on an all-padding row: a warning
    assert diagnose(module, Config(mask="drop")).healthy
    assert not diagnose(module, Config(mask="drop", strict=True)).healthy


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_exit_codes_and_json(capsys, tmp_path):
    code, out, _ = run(capsys, "doctor", f"{MODULES}:einsum_ok", "--mask", "keep", "--json")
    assert code == 0 and json.loads(out)["healthy"] is True
    report = tmp_path / "doctor.md"
    code, out, _ = run(
        capsys, "doctor", f"{MODULES}:gpt_leaky", "--causal", "--report", str(report)
    )
    assert code == 1 and "FAIL  causal_leak" in out and "- causal no-leak: output" in out
    assert report.read_text().startswith("# Attention doctor:")
    code, out, _ = run(
        capsys, "doctor", "torch.nn:MultiheadAttention", "--mask", "drop", "--d-model", "32"
    )
    assert code == 0 and out.splitlines()[-1].startswith("=> healthy")


USAGE_ERRORS = {
    "missing file": ([f"nope/{MODULES}:x"], "no such file"),
    "missing attribute": ([f"{MODULES}:nothing_here"], "has no attribute 'nothing_here'"),
    "bad target": (["just_a_name"], "must look like"),
    "factory raises": ([f"{MODULES}:raising_factory"], "raised ValueError: this factory is broken"),
    "wrong signature": ([f"{MODULES}:NoInputs"], "cannot be called as forward(x)"),
    "mask not taken": (
        [f"{MODULES}:gpt_ok", "--mask", "keep"],
        "cannot be called as forward(x, mask)",
    ),
    "bad mask": ([f"{MODULES}:gpt_ok", "--mask", "upside-down"], "invalid choice"),
    "bad sizes": ([f"{MODULES}:gpt_ok", "--d-model", "30", "--heads", "4"], "multiple of --heads"),
}


@pytest.mark.parametrize("case", USAGE_ERRORS)
def test_usage_errors_are_one_line_and_exit_2(capsys, case):
    argv, words = USAGE_ERRORS[case]
    code, out, err = run(capsys, "doctor", *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and words in err and "Traceback" not in err


def _sdpa_finding(module, config):
    d = diagnose(module, config)
    return d, next(f for f in d.findings if f.probe == "agrees with SDPA")


@pytest.mark.parametrize("positional", [True, False])  # declared, or a mere bias buffer
def test_a_position_bias_sdpa_cannot_add_has_its_scale_measured_from_the_weights(positional):
    config = Config(causal=True, positions="absolute" if positional else "auto")
    d, sdpa = _sdpa_finding(dm.AlibiCausal(64, 4), config)
    assert d.healthy and sdpa.status == "pass", d.text()
    assert "bias B of positions alone" in sdpa.message and "s = 0.25" in sdpa.message
    d, sdpa = _sdpa_finding(dm.alibi_unscaled(64, 4), Config(causal=True, positions="relative"))
    assert sdpa.status == "fail" and "missing_scale" in sdpa.message, d.text()


def test_a_module_unscaled_by_design_with_a_learned_bias_is_held_to_its_scale():
    d, sdpa = _sdpa_finding(dm.T5Style(64, 4), Config(scale=1.0))
    assert d.healthy and sdpa.status == "pass" and "s = 1," in sdpa.message, d.text()
    d, sdpa = _sdpa_finding(dm.T5Style(64, 4, factor=0.25), Config(scale=1.0))
    assert sdpa.status == "fail" and "double_scale" in sdpa.message, d.text()
    d, sdpa = _sdpa_finding(dm.T5Style(64, 4), Config())  # its relative_attention_bias says T5
    assert sdpa.status == "pass" and "unscaled by design" in sdpa.message, d.text()
    d, sdpa = _sdpa_finding(dm.T5Style(64, 4, factor=0.25), Config())
    assert sdpa.status == "fail" and "double_scale" in sdpa.message, d.text()


def test_a_scale_that_is_no_known_form_fails_unnamed():
    d, sdpa = _sdpa_finding(dm.T5Style(64, 4, factor=0.6), Config(scale=1.0))
    assert sdpa.status == "fail" and "s = 0.6," in sdpa.message, d.text()
    assert sdpa.message.endswith("no known trap's scale")


def test_a_position_term_that_reads_the_query_is_not_compared_rather_than_failed():
    d, sdpa = _sdpa_finding(dm.QueryRelative(64, 4), Config(positions="absolute"))
    assert sdpa.status == "skip" and "bias B of positions alone" in sdpa.message, d.text()


def test_an_output_layer_called_out_is_recognized():
    d = diagnose(dm.ScaleByWidthOut(64, 4), Config(causal=True))
    failed = {f.probe: f.message for f in d.findings if f.status == FAIL}
    assert "agrees with SDPA" in failed and "qkv (q | k | v), out" in failed["agrees with SDPA"]


def test_width_comes_from_the_config_when_the_module_hides_it():
    d = diagnose(dm.BareParameters(32, 4), Config(mask="keep", d_model=32))
    assert d.healthy, d.text()


def test_an_inverted_convention_gets_a_hint():
    d = diagnose(dm.SeqFirstWrapper(32, 4), Config(mask="keep"))  # it is a drop-mask module
    leak = next(f for f in d.findings if f.probe == "causal no-leak")
    assert leak.status == FAIL and "passes with --mask drop" in leak.message


def test_a_random_module_is_not_blamed_for_positions_or_scale():
    from harness.catalogue.registry import load

    pair = load("dropout_in_eval")
    module = pair.card.build(pair.buggy, pair.card.shape)
    d = diagnose(module, Config(mask="keep"))
    status = {f.probe: f.status for f in d.findings}
    assert status["eval determinism"] == FAIL
    assert status["permutation equivariance"] == status["agrees with SDPA"] == "skip"


def _diagnosis(*statuses, strict=False):
    """A diagnosis with one finding per status, named after it."""
    findings = [Finding(f"{s} probe", s, f"evidence {i}") for i, s in enumerate(statuses)]
    return Diagnosis("mine", Config(strict=strict), findings)


def test_warnings_fail_only_in_strict_mode_and_failures_exit_1():
    lenient, strict = _diagnosis(PASS, WARN, SKIP), _diagnosis(PASS, WARN, SKIP, strict=True)
    assert (lenient.healthy, lenient.exit_code) == (True, 0)
    assert (strict.healthy, strict.exit_code) == (False, 1)  # 2 is for usage errors
    failing = _diagnosis(PASS, FAIL)
    assert (failing.healthy, failing.exit_code) == (False, 1)
    assert [f.probe for f in strict.failures] == ["warn probe"]


def test_text_aligns_the_evidence_and_sums_up():
    d = Diagnosis(
        "mine",
        Config(),
        [Finding("a", PASS, "first"), Finding("a much longer name", WARN, "second")],
    )
    lines = d.text().splitlines()
    assert lines[0] == "attention doctor: mine"
    assert lines[1].index("first") == lines[2].index("second")
    assert lines[1].startswith("PASS  a ") and lines[2].startswith("WARN  a much longer name  ")
    assert lines[-1] == "=> healthy (1 warning(s))"
    assert _diagnosis(WARN, FAIL).text().splitlines()[-1] == "=> 1 problem(s)"
    assert _diagnosis(WARN, FAIL, strict=True).text().splitlines()[-1] == "=> 2 problem(s)"


def test_json_has_every_finding_and_the_verdict():
    data = json.loads(_diagnosis(PASS, WARN, SKIP, strict=True).to_json())
    assert data["target"] == "mine" and data["healthy"] is False
    assert data["config"]["strict"] is True
    assert [f["status"] for f in data["findings"]] == [PASS, WARN, SKIP]
    assert data["findings"][1] == {
        "probe": "warn probe",
        "status": WARN,
        "message": "evidence 1",
        "traps": [],
        "at": "",
        "why": "",
    }
    assert json.loads(_diagnosis(PASS, WARN).to_json())["healthy"] is True


def test_markdown_states_the_verdict_and_tabulates_the_findings():
    text = _diagnosis(PASS, FAIL).markdown()
    assert text.startswith("# Attention doctor: `mine`\n")
    assert "Verdict: **problems found**" in text
    assert "| fail probe | fail     | evidence 1 |" in text.splitlines()
    assert "Verdict: **healthy**" in _diagnosis(PASS, SKIP).markdown()


def test_progress_is_told_every_step_in_order():
    """The command line draws its progress bar from these calls (on a terminal, on stderr)."""
    steps: list[str] = []
    diagnose(dm.gpt_ok(32, 4), Config(causal=True), progress=steps.append)
    assert steps == list(STEPS)


def test_mask_none_means_the_caller_never_passes_one_whatever_the_signature():
    """A forward that takes a mask it ignores: the default (auto) probes it with one and fails
    it, so a broken mask never passes unseen; --mask none, the caller's word, probes none."""
    module = dm.MaskNeverUsed(64, 4)
    auto = diagnose(module, Config(), "MaskNeverUsed")
    assert not auto.healthy
    assert any(f.probe == "mask convention" and f.status == FAIL for f in auto.findings)
    declared = diagnose(module, Config(mask="none"), "MaskNeverUsed")
    assert declared.healthy, declared.text()
    assert all("mask" not in f.probe or f.status == SKIP for f in declared.findings), [
        (f.probe, f.status) for f in declared.findings
    ]


LAYOUT_CASES = {  # module, options a user who knows it declares
    "whisper (T, T)": (lambda: dm.whisper_ok(64, 4), Config(mask="additive", mask_shape="qk")),
    "bert (B, 1, 1, T)": (
        lambda: dm.BertExtended(64, 4),
        Config(mask="additive", mask_shape="b11k"),
    ),
    "torch attn_mask (T, T)": (
        lambda: nn.MultiheadAttention(64, 4, batch_first=True),
        Config(mask="drop", mask_shape="qk"),
    ),
}


@pytest.mark.parametrize("case", LAYOUT_CASES)
def test_masks_of_every_layout_real_code_uses_are_healthy_declared_and_detected(case):
    make, config = LAYOUT_CASES[case]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        module = make()
    declared = diagnose(module, config, case)
    assert declared.healthy, declared.text()
    if not isinstance(module, nn.MultiheadAttention):  # torch's takes both: declared only
        detected = diagnose(module, Config(), case)  # the first reading that works (several)
        assert detected.healthy, detected.text()


def test_a_t_by_t_mask_that_lets_the_future_in_fails_causal_no_leak():
    d = diagnose(dm.whisper_wrong_corner(64, 4), Config(mask="additive", mask_shape="qk"))
    failed = {f.probe: f.message for f in d.findings if f.status == FAIL}
    assert "causal no-leak" in failed, d.text()
    skipped = {f.probe: f.message for f in d.findings if f.status == SKIP}
    assert "cannot leave one without keys" in skipped["all-masked rows"]


@pytest.mark.parametrize("batch", [4, 16])
def test_a_t_by_t_mask_is_detected_whatever_the_batch(batch):
    """Whisper's mask[:T, :T] also takes a (B, 1, T, T) mask whole while B <= T: detection
    must not settle for that coincidence, which breaks at a batch of 16."""
    d = diagnose(dm.whisper_ok(64, 4), Config(batch=batch), "WhisperStyle")
    assert d.healthy, d.text()
    found = next(f for f in d.findings if f.probe == "mask convention")
    assert "--mask-shape qk" in found.message, found.message


def test_a_module_that_ignores_a_t_by_t_mask_fails_padding_no_leak():
    """The same padding for every sequence is what a (T, T) mask can hold: a module that
    ignores it reads the padding."""

    class Ignores(dm.WhisperStyle):
        def forward(self, x, mask=None):
            return super().forward(x, None)

    module = Ignores(64, 4)
    d = diagnose(module, Config(mask="additive", mask_shape="qk"))
    failed = {f.probe for f in d.findings if f.status == FAIL}
    assert "padding no-leak" in failed, d.text()


def test_an_intended_scale_is_compared_as_declared():
    """Unscaled by design is healthy with --scale none and missing_scale without it; a module
    that scales as usual is not healthy when told it is unscaled."""
    unscaled, usual = dm.Unscaled(64, 4), dm.einsum_ok(64, 4)
    assert diagnose(unscaled, Config(mask="keep", scale=1.0)).healthy
    plain = {f.probe: f.message for f in diagnose(unscaled, Config(mask="keep")).findings}
    assert "missing_scale" in plain["agrees with SDPA"]
    told = {f.probe: f for f in diagnose(usual, Config(mask="keep", scale=1.0)).findings}
    assert told["agrees with SDPA"].status == FAIL
    scaled = diagnose(usual, Config(mask="keep", scale=1 / 4))  # 1/sqrt(16): the usual one
    assert scaled.healthy, scaled.text()


@pytest.mark.parametrize(("value", "code"), [("none", 1), ("0.25", 0), ("0", 2), ("x", 2)])
def test_scale_on_the_command_line(capsys, value, code):
    argv = ["doctor", f"{MODULES}:einsum_ok", "--mask", "keep", "--scale", value]
    assert cli.main(argv) == code
    err = capsys.readouterr().err
    assert code != 2 or "--scale: a positive number or none" in err, err


def causes(d: Diagnosis) -> list:
    return [(c.trap, len(c.probes)) for c in d.causes]


def test_the_tutorials_module_with_its_documented_mask_fails_once_as_mask_rank():
    module = dm.TutorialMultiHead(64, 4)
    right = diagnose(module, Config(mask="keep"), "TutorialMultiHead")
    assert right.healthy, right.text()
    documented = diagnose(module, Config(mask="keep", mask_shape="b1qk"), "TutorialMultiHead")
    assert causes(documented) == [("mask_rank", 12)], documented.text()
    assert documented.problems == 1
    failing = [line for line in documented.text().splitlines() if line.startswith("FAIL")]
    assert len(failing) == 1 and "mask_rank" in failing[0], documented.text()
    assert (
        "probes raise" not in documented.text()
        and "raises RuntimeError: batch1" in documented.text()
    )
    assert json.loads(documented.to_json())["causes"][0]["trap"] == "mask_rank"


def test_probes_failing_with_one_error_are_one_cause_named_by_its_numbers():
    """Where the forward's reading names nothing (it raised before the attention), the error the
    probes share is the cause, said once, and its numbers name the trap."""
    error = "raises: RuntimeError: batch1 must be a 3D tensor"
    findings = [Finding(f"probe {i}", FAIL, error) for i in range(12)]
    findings.append(Finding("other", FAIL, "leaks"))
    [cause] = explain(findings, Config(mask="keep", mask_shape="b1qk"))
    assert cause.trap == "mask_rank" and len(cause.probes) == 12
    [unnamed] = explain(findings, Config(mask="keep"))  # a 3-D mask: the numbers name nothing
    assert unnamed.trap is None


def test_a_trap_a_probe_watched_at_a_line_is_one_cause_there_and_only_when_it_is_alone():
    """A failure that says where it watched its one trap happen is a cause at that line, with
    what it watched; two probes that watched it there are one cause; a failure naming causes
    it cannot tell apart, or watching nothing, is none."""
    at, why = "attn.py:60 `k.index_copy_(2, pos + 1, v)`", "decides where the cache writes"
    findings = [
        Finding("cached decoding", FAIL, "wrote at 1..3", ("stale_cache",), at, why),
        Finding("cache reuse", FAIL, "after reset", ("stale_cache",), at, why),
        Finding("other", FAIL, "unsure", ("stale_cache", "rope_cache_offset"), at, why),
        Finding("unwatched", FAIL, "leaks", ("causal_leak",)),
        Finding("passing", PASS, "fine", ("causal_leak",), at, why),
    ]
    [cause] = explain(findings, Config())
    assert (cause.trap, cause.at, cause.fit, cause.read) == ("stale_cache", at, why, True)
    assert cause.probes == ("cached decoding", "cache reuse")


def test_keys_transposed_on_the_batch_axis_fail_once_as_transpose():
    """Read from the forward (the transpose that made the product's keys, at its line), and,
    where the record is not there to read, from the error's numbers."""
    d = diagnose(dm.tutorial_keys_swapped(64, 4), Config(mask="keep"), "swapped")
    (cause,) = d.causes
    assert cause.trap == "transpose" and cause.read, d.text()
    assert "K.transpose(*self.keys)" in cause.at and "axes (0, 1)" in cause.fit, cause
    said = [line for line in d.text().splitlines() if line.startswith("FAIL")]
    assert len(said) == 1 and said[0].startswith("FAIL  transpose"), d.text()  # said once
    (unread,) = explain(d.findings, d.config)
    assert unread.trap == "transpose", unread
    assert "batch (4) on its second axis and 8 on its first" in unread.fit


def test_an_error_no_trap_explains_is_one_cause_without_a_name():
    d = diagnose(dm.TutorialMultiHead(64, 4), Config(mask="keep", mask_shape="bk"))
    named = [c for c in d.causes if c.trap is not None]
    assert not named and d.causes, d.text()
    said = [line for line in d.text().splitlines() if line.startswith("FAIL")]
    assert len(said) == 1 and said[0].startswith("FAIL  one cause"), d.text()  # said once


def test_the_context_a_module_registers_bounds_the_shapes_it_is_called_with():
    """nanoGPT's block registers a causal buffer of block_size rows and says nothing else of
    its context: at d_model 384 it must not be called with 384 tokens when built for 256."""
    module = dm.CausalSelfAttention(384, 6, block_size=256)
    d = diagnose(module, Config(causal=True), "CausalSelfAttention")
    found = {f.probe: f for f in d.findings}
    assert found["shape contract"].status == PASS, found["shape contract"].message
    assert "up to its context, 256" in found["shape contract"].message
    assert d.healthy, d.text()


def test_what_a_module_says_beats_its_config():
    """A global layer whose own sliding_window is None has no window, whatever its config says
    (Gemma3's layers share one config)."""
    module = dm.gpt_ok(64, 4)
    module.config = type("Config", (), {"sliding_window": 4, "block_size": 8})()
    module.sliding_window = None
    subject = Subject(module, Config(causal=True))
    assert subject.window is None
    assert subject.context == 128  # its causal buffer's rows, before its config's 8
    module.sliding_window = 3
    assert Subject(module, Config(causal=True)).window == 3


def test_an_additive_mask_is_passed_as_real_callers_build_it():
    """transformers fills its additive masks with finfo.min: an all-padding row stays finite,
    so a correct BERT-style module gets no NaN warning that the doctor's own -inf would cause."""
    d = diagnose(dm.BertExtended(64, 4), Config(mask="additive", mask_shape="b11k"))
    found = {f.probe: f for f in d.findings}
    assert found["all-masked rows"].status == PASS, found["all-masked rows"].message


def test_a_cache_parameter_the_module_never_uses_is_not_probed_as_a_decoder():
    d = diagnose(dm.MinGPTStyle(64, 4), Config(causal=True), "MinGPTStyle")
    assert d.healthy, d.text()
    found = {f.probe: f for f in d.findings}
    for name in ("cached decoding", "cache reuse"):
        assert found[name].status == SKIP and "returns no cache" in found[name].message


def test_a_mask_parameter_is_found_by_what_it_is_not_by_a_list():
    """fairseq-style names no list holds: future_mask is a mask; need_weights is not."""

    class FutureMasked(dm.EinsumAttention):
        def forward(self, x, future_mask=None, need_weights=False):
            return super().forward(x, future_mask)

    d = diagnose(FutureMasked(64, 4), Config(), "FutureMasked")
    found = next(f for f in d.findings if f.probe == "mask convention")
    assert found.status == PASS and "`future_mask`" in found.message, found.message
    assert d.healthy, d.text()
    assert diagnose(FutureMasked(64, 4), Config(mask="keep")).healthy


def test_unit_variance_init_is_named_even_without_returned_weights():
    """The tutorial's multi-head module returns no weights: its saturation is read off its own
    projections. normal_(std=1) saturates; the default init does not."""
    module = dm.TutorialMultiHead(64, 4)
    default = {f.probe: f for f in diagnose(module, Config(mask="keep")).findings}
    assert default["attention weights"].status == SKIP, default["attention weights"]
    with torch.no_grad():
        for linear in module.modules():
            if isinstance(linear, nn.Linear):
                linear.weight.normal_(std=1.0, generator=torch.Generator().manual_seed(0))
    found = {f.probe: f for f in diagnose(module, Config(mask="keep")).findings}
    weights = found["attention weights"]
    assert weights.status == FAIL and "init_unit_variance" in weights.message, weights
    assert "read off its projections" in weights.message


@pytest.mark.parametrize(
    ("dim", "words"), [(None, "the batch (F.softmax without dim"), (-2, "the queries (dim=-2)")]
)
def test_a_softmax_over_another_axis_is_named_softmax_dim(dim, words):
    """The tutorial's single head without dim: under its causal mask the weights are NaN where
    every sequence masks a key, and sum to 1 over the batch elsewhere."""
    module = dm.TutorialHead(64, 16, 16, dim=dim)
    found = {f.probe: f for f in diagnose(module, Config(mask="keep")).findings}
    weights = found["attention weights"]
    assert weights.status == FAIL and "softmax_dim" in weights.message, weights
    assert words in weights.message


def test_a_declared_mask_shape_narrows_convention_detection_to_it():
    """--mask auto --mask-shape b1qk: only (B, 1, T, T) readings are tried, so the tutorial's
    module, which takes (B, T, T) only, is not passed under a shape its caller never uses."""
    d = diagnose(dm.TutorialMultiHead(64, 4), Config(mask_shape="b1qk"), "TutorialMultiHead")
    found = next(f for f in d.findings if f.probe == "mask convention")
    assert found.status == FAIL and "every call raises" in found.message, d.text()
    auto = diagnose(dm.TutorialMultiHead(64, 4), Config(), "TutorialMultiHead")
    detected = next(f for f in auto.findings if f.probe == "mask convention")
    assert detected.status == PASS and "(B, T, T)" in detected.message, auto.text()


@pytest.mark.parametrize("pair", [on_queries_buggy, on_queries_fixed], ids=["buggy", "fixed"])
def test_a_padding_mask_on_the_queries_is_named_padding_on_queries(pair):
    d = diagnose(pair.ScaledDotProductAttention(32, 16, 16), Config(mask="keep", mask_shape="bk"))
    found = {f.probe: f for f in d.findings}["padding no-leak"]
    if pair is on_queries_fixed:
        assert found.status == PASS, d.text()
    else:
        assert found.status == FAIL and "(padding_on_queries" in found.message, d.text()


@pytest.mark.parametrize("on_queries", [False, True])
def test_padding_on_the_queries_is_named_where_the_padded_frames_are_zeroed(on_queries):
    """Padded inputs zeroed before attending: redrawing them moves nothing, yet a mask that
    reaches the queries lets every real frame read the zeroed ones, which is what it does
    with no mask at all."""
    module = seeded_build(dm.ZeroesPaddedFrames, 32, 4, on_queries=on_queries)
    d = diagnose(module, Config(mask="keep", mask_shape="bk"))
    found = {f.probe: f for f in d.findings}["padding no-leak"]
    assert (found.status == FAIL) == on_queries, d.text()
    assert ("(padding_on_queries" in found.message) == on_queries, d.text()


@pytest.mark.parametrize("one_block", [False, True])
def test_sequences_packed_into_one_causal_row_are_named_packing_where_they_are_masked(one_block):
    """The batch packed into one row, masked as one causal sequence: sequence 0 reads no
    other, the last reads those packed before it; the recorded forward attends the batch as
    one row, so the mixing is documents not kept apart, located at the mask."""
    d = diagnose(seeded_build(dm.PackedRows, 32, 4, one_block=one_block), Config(causal=True))
    found = {f.probe: f for f in d.findings}["batch independence"]
    assert (found.status == FAIL) == one_block, d.text()
    if one_block:
        assert "output of sequence 2 depends on sequence" in found.message, d.text()
        first = d.causes[0]
        assert first.trap == "packing_cross_document", d.text()
        assert "scores = (q @ k.transpose(-1, -2)" in first.at, d.text()
    else:
        assert d.healthy, d.text()


def test_a_class_token_left_unturned_does_not_make_rotary_look_position_blind():
    """EVA's class token is not turned and its first patch is turned by angles of 0: the two
    look alike to a rotation, so a swap of them moves nothing later; the next two differ."""
    d = diagnose(seeded_build(dm.ClassTokenUnturned, 32, 4), Config(positions="relative"))
    order = {f.probe: f for f in d.findings}["token order"]
    assert order.status == PASS and "swapping tokens 1 and 2" in order.message, d.text()


@pytest.mark.parametrize("forgets", [False, True])
def test_a_leak_from_an_attention_that_masks_nothing_is_located_there(forgets):
    """A causal call that leaks, recorded again, attends with no mask and is_causal unset at
    one line: the leak is causal_leak at that line, and telling SDPA is_causal is its fix."""
    module = seeded_build(dm.UnpaddedShortcut, 32, 4, forgets=forgets)
    d = diagnose(module, Config(causal=True, mask="keep", mask_shape="bk"))
    if not forgets:
        assert d.healthy, d.text()
        return
    first = d.causes[0]
    number = int(first.at.split(":")[1].split()[0])
    statement = Path(dm.__file__).read_text().splitlines()[number - 1 : number + 2]
    assert first.trap == "causal_leak", d.text()
    assert "attn_mask=None, is_causal=not self.forgets" in " ".join(statement), d.text()


@pytest.mark.parametrize("wide", [False, True])
def test_a_window_a_key_too_wide_is_located_at_the_modules_own_mask(wide):
    """A band of its own chosen by ``torch.where``, the caller's padding added after it: a
    band one key too wide is the module's mask, located where it is applied, not where the
    caller's is added."""
    module = seeded_build(dm.LocalBiasThenCallersMask, 32, 4, wide=wide)
    d = diagnose(module, Config(causal=True, mask="keep", mask_shape="bk", window=4))
    if not wide:
        assert d.healthy, d.text()
        return
    first = d.causes[0]
    assert first.trap == "sliding_window_off_by_one", d.text()
    assert "torch.where(self.bias[:T, :T], scores, floor)" in first.at, d.text()


def test_a_causal_mask_filled_the_wrong_way_is_located_at_the_modules_own_mask():
    """GPT-Neo's ``torch.where`` with its values swapped, the caller's padding added after it:
    the fill lands where its triangle keeps, which is the module's own mask, located where it
    is applied, not where the caller's is made."""
    module = seeded_build(dm.LocalBiasThenCallersMask, 32, 4, window=64, inverted=True)
    d = diagnose(module, Config(causal=True, mask="keep", mask_shape="bk"))
    first = d.causes[0]
    assert first.trap in ("mask_bool", "causal_leak"), d.text()
    assert "torch.where(self.bias[:T, :T], floor, scores)" in first.at, d.text()


def test_an_attention_told_it_is_causal_or_given_a_mask_is_not_said_to_mask_nothing():
    """The line of an attention that masks nothing, read off one recorded call: an SDPA call
    told ``is_causal`` masks, one given a mask masks, one given neither does not."""
    module = seeded_build(dm.UnpaddedShortcut, 32, 4)
    subject = Subject(module, Config(causal=True, mask="keep", mask_shape="bk"))
    x = subject.x(2, 6, 0)
    padded = torch.ones(2, 6, 6, dtype=torch.bool).tril()
    padded[1, :, 4:] = False  # the second sequence padded: the masked branch
    assert unmasked_at(subject, x, torch.ones(2, 6, 6, dtype=torch.bool).tril()) == ""
    assert unmasked_at(subject, x, padded) == ""
    module.forgets = True
    at = unmasked_at(subject, x, torch.ones(2, 6, 6, dtype=torch.bool))
    assert "scaled_dot_product_attention(" in at and "doctor_modules.py" in at, at


def test_a_padding_leak_of_keys_is_not_named_padding_on_queries():
    d = diagnose(dm.WeakPaddingFill(16), Config(mask="keep", mask_shape="bk"))
    found = {f.probe: f for f in d.findings}["padding no-leak"]
    assert found.status == FAIL and "depends on padded input" in found.message, d.text()
    assert "padding_on_queries" not in found.message


def test_a_context_shorter_than_the_probes_shortens_them():
    d = diagnose(dm.CausalSelfAttention(32, 4, block_size=6), Config(causal=True))
    shape = {f.probe: f for f in d.findings}["shape contract"]
    assert d.healthy and d.config.seq_len == 6, d.text()
    assert "every probe runs at seq_len 6 instead of 8" in shape.message


def test_a_module_of_one_fixed_length_is_probed_at_that_length():
    d = diagnose(dm.OneWindow(32, 4, tokens=8), Config(positions="absolute"))
    shape = {f.probe: f for f in d.findings}["shape contract"]
    assert d.healthy and "only at 8 tokens" in shape.message, d.text()


def test_a_module_that_takes_one_length_unsaid_is_probed_at_that_length_only():
    d = diagnose(dm.CompressedKeys(32, 4, tokens=8), Config(positions="absolute"))
    shape = {f.probe: f for f in d.findings}["shape contract"]
    assert d.healthy and "only at 8 tokens: it runs on no length beside it" in shape.message, (
        d.text()
    )
    # one that refuses short sequences but runs beside the probes' length takes more than one
    short = diagnose(dm.ShortTable(32, 4, longest=64, shortest=4), Config(mask="keep"))
    refused = {f.probe: f for f in short.findings}["shape contract"]
    assert refused.status == FAIL and "sequence shorter than a block" in refused.message


def test_a_length_past_the_longest_a_module_takes_is_not_taken_not_failed():
    d = diagnose(dm.ShortTable(32, 4, longest=16), Config(mask="keep"))
    shape = {f.probe: f for f in d.findings}["shape contract"]
    assert shape.status == PASS, d.text()
    assert "not taken: seq_len == d_model: it runs on up to 16 tokens, and raises on 32" in (
        shape.message
    )
    broken = diagnose(dm.ShortTable(32, 4, longest=4), Config(mask="keep"))  # not the probes' 8
    assert not broken.healthy, broken.text()


def test_rotary_tables_the_output_ignores_make_no_rotary_module():
    d = diagnose(dm.IgnoresRotaryTables(32, 4), Config())
    found = {f.probe: f for f in d.findings}
    assert d.healthy, d.text()
    assert "its output ignores them" in found["token order"].message
    assert found["permutation equivariance"].status == PASS


def test_rotary_tables_kept_in_buffers_leave_the_module_comparable():
    d = diagnose(dm.OwnRotaryTables(32, 4), Config(causal=True, positions="relative"))
    sdpa = {f.probe: f for f in d.findings}["agrees with SDPA"]
    assert sdpa.status == PASS and "RoPE (half)" in sdpa.message, d.text()


def test_key_and_value_cache_buffers_leave_the_module_comparable():
    """gpt-fast's KVCache keeps k_cache and v_cache buffers: keys the call writes itself, not a
    bias SDPA would miss."""
    module = dm.OwnRotaryTables(32, 4)
    module.register_buffer("k_cache", torch.randn(1, 4, 64, 8))  # as after an earlier call
    module.register_buffer("v_cache", torch.randn(1, 4, 64, 8))
    d = diagnose(module, Config(causal=True, positions="relative"))
    sdpa = {f.probe: f for f in d.findings}["agrees with SDPA"]
    assert sdpa.status == PASS, d.text()


def _named_by_sdpa(module, config):
    d, sdpa = _sdpa_finding(module, config)
    assert sdpa.status == FAIL, d.text()
    return sdpa.message


def test_a_wrong_form_is_fitted_on_every_reading_of_a_fused_projection():
    torch.manual_seed(0)  # weights under which per K/V group is the reading nearest SDPA
    module = dm.CausalSelfAttention(64, 4, split_by_view=True)
    message = _named_by_sdpa(module, Config(causal=True))
    assert "c_attn (per K/V group)" in message  # nearest, and wrong: the fit is on q | k | v
    assert "head_split_view" in message


def test_a_mask_read_the_other_way_round_is_named_even_where_no_bool_convention_was_declared():
    config = Config(mask="additive", mask_shape="b1qk")
    assert "sdpa_mask_inverted" in _named_by_sdpa(dm.InvertsAdditive(32, 4), config)


def test_softmax_over_the_queries_with_a_finite_fill_is_softmax_dim():
    config = Config(mask="keep", mask_shape="bk")
    assert "softmax_dim" in _named_by_sdpa(dm.QuerySoftmaxPadded(32, 4), config)


ROLE_NAMES = [  # bentrevett, jadore, Bloem, Decision Transformer, a Keras port
    ("fc_q", "fc_k", "fc_v", "fc_o"), ("w_qs", "w_ks", "w_vs", "fc"),
    ("toqueries", "tokeys", "tovalues", "unifyheads"), ("q_net", "k_net", "v_net", "proj_net"),
    ("query_dense", "key_dense", "value_dense", "output_dense"),
]  # fmt: skip


@pytest.mark.parametrize("names", ROLE_NAMES)
def test_projections_are_recognized_by_what_their_names_say(names):
    """By the recorded forward first; by their names alone where no forward is read (the
    fallback: ``recognize`` without roles)."""
    assert recognize(dm.NamedLayers(32, 4, names))
    d, sdpa = _sdpa_finding(dm.NamedLayers(32, 4, names), Config())
    assert sdpa.status == PASS and ", ".join(names) in sdpa.message, d.text()
    d, sdpa = _sdpa_finding(dm.NamedLayers(32, 4, names, scale_by=32), Config())
    assert sdpa.status == FAIL and "scale_d_model" in sdpa.message, d.text()


def test_weights_whose_rows_do_not_sum_to_one_are_named_scale_after_softmax():
    d, sdpa = _sdpa_finding(dm.T5Style(64, 4, after=0.25), Config(scale=1.0))
    assert sdpa.status == FAIL and "rows sum to 0.25, not 1" in sdpa.message, d.text()
    assert "scale_after_softmax" in sdpa.message


def test_a_rotary_base_read_off_the_inv_freq_of_its_rotary_embedding():
    d, sdpa = _sdpa_finding(dm.OwnBaseRotary(32, 4), Config(causal=True, positions="relative"))
    assert sdpa.status == PASS and "RoPE (half)" in sdpa.message, d.text()
    config = Config(causal=True, positions="relative", rope_base=10000.0)  # declared wrong
    assert _sdpa_finding(dm.OwnBaseRotary(32, 4), config)[1].status == SKIP


def test_a_module_that_masks_the_future_undeclared_is_compared_with_causal_sdpa():
    d, sdpa = _sdpa_finding(dm.SelfAttention(32, 4), Config())  # causal, as its forward shows
    assert sdpa.status == PASS and d.config.causal, d.text()
    # an encoder's layer that masks the future though its flag says not: compared as it is
    d, sdpa = _sdpa_finding(dm.EncoderSelfAttention(32, 4), Config())
    assert sdpa.status == PASS and "it masks the future by itself" in sdpa.message, d.text()
    # a module handed the doctor's causal (B, T, T) mask does not mask the future by itself
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=True)
    d, sdpa = _sdpa_finding(mha, Config(mask="drop"))
    assert sdpa.status == PASS and "by itself" not in sdpa.message, d.text()


def test_an_input_the_module_refuses_with_not_implemented_skips_that_probe():
    d = diagnose(dm.RightPaddingOnly(16), Config(mask="keep", mask_shape="bk"))
    padding = {f.probe: f for f in d.findings}["padding no-leak"]
    assert d.healthy and padding.status == SKIP, d.text()
    assert "valid_lens pads on the right only" in padding.message


def test_an_optional_position_input_that_is_not_position_ids_is_left_to_its_default():
    d = diagnose(dm.PositionEmbeddingInput(32, 4), Config())
    assert d.healthy, d.text()


def test_a_projection_one_head_wide_shared_by_the_heads_is_read_per_head():
    d, sdpa = _sdpa_finding(dm.SharedPerHead(32, 4), Config())
    assert sdpa.status == PASS and "queries, keys, values, fc_out" in sdpa.message, d.text()
    d, sdpa = _sdpa_finding(dm.SharedPerHead(32, 4, scale_by=32), Config())
    assert sdpa.status == FAIL and "scale_d_model" in sdpa.message, d.text()


@pytest.mark.parametrize("tile", [False, True])
def test_grouped_heads_are_followed_through_layers_named_by_their_role(tile):
    d = diagnose(dm.RaschkaGQA(32, 4, tile=tile), Config(causal=True, kv_grouping="blocks"))
    grouped = {f.probe: f for f in d.findings}["grouped heads"]
    assert grouped.status == (FAIL if tile else PASS), d.text()


def test_a_layer_a_mask_turns_causal_is_warned_that_its_values_are_never_read():
    """Whisper's SDPA layer: is_causal whenever a mask is passed, the mask itself unread. As
    its model calls it (the causal mask, every time) it is right: warnings, with the fact at
    its line; a layer that drops its mask outright still fails (the test above)."""
    d = diagnose(dm.MaskSwitchesCausal(64, 4), Config(mask="additive", mask_shape="qk"))
    found = {f.probe: f for f in d.findings}
    assert d.healthy and d.config.causal, d.text()
    assert found["padding no-leak"].status == WARN, d.text()
    assert "never read" in found["padding no-leak"].message
    assert found["causal no-leak"].status == WARN, d.text()
    [unread] = [f for f in d.facts if f.name == "mask" and "never read" in f.value]
    assert "only is_causal=True" in unread.value and "doctor_modules.py:" in unread.line


class CountsCalls(nn.Module):
    """Plain attention that counts its forwards, its copies' too (on the class)."""

    calls = 0

    def __init__(self, d_model=16):
        super().__init__()
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, x):
        type(self).calls += 1
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return torch.softmax(q @ k.transpose(1, 2) / q.shape[-1] ** 0.5, dim=-1) @ v


def test_making_a_subject_runs_none_of_the_modules_code_until_it_is_settled():
    CountsCalls.calls = 0
    subject = Subject(CountsCalls(), Config())
    assert CountsCalls.calls == 0 and subject.new_cache is None and CountsCalls.calls == 0
    assert subject.d_model == 16 and CountsCalls.calls > 0  # settled by calling it


class HeadsFirstWeights(nn.Module):
    """fairseq's (and torchscale's) layout: the weights returned (h, B, T, S); a key padding
    mask (True: a real token); a scale it keeps frozen (requires_grad False)."""

    def __init__(self, d_model=16, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.scale = nn.Parameter(torch.tensor((d_model // heads) ** -0.5), requires_grad=False)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        scores = (q @ k.transpose(-2, -1) * self.scale).masked_fill(
            ~mask[:, None, None], -torch.inf
        )
        weights = scores.softmax(dim=-1)  # (B, h, T, S)
        out = self.out((weights @ v).transpose(1, 2).reshape(B, T, C))
        return out, weights.transpose(0, 1)  # (h, B, T, S)


def test_weights_returned_heads_first_are_read_so_and_a_frozen_parameter_is_left_alone():
    d = diagnose(HeadsFirstWeights(), Config(mask="keep", mask_shape="bk"))
    found = {f.probe: f for f in d.findings}
    assert found["attention weights"].status == PASS, d.text()
    assert found["all-masked rows"].status == WARN, d.text()  # NaN, said: no crash


def test_nan_only_at_queries_left_no_key_in_half_precision_is_a_fully_masked_row():
    """Phi-3's float32 finfo.min mask added in place to float16 scores turns -inf; a padded
    query whose window holds only padding then gets a row of -inf, NaN: named, not just seen."""
    config = Config(causal=True, mask="keep", mask_shape="bk", window=4)
    d = diagnose(dm.WindowMaskAddedInPlace(32, 4), config)
    half = {f.probe: f for f in d.findings}["float16 robustness"]
    assert half.status == FAIL and "fully_masked_row" in half.traps, d.text()
    assert {f.probe: f for f in d.findings}["all-masked rows"].status == PASS, d.text()


def _line_of(module: object, text: str) -> int:
    with open(module.__file__) as source:  # type: ignore[attr-defined]
        return next(i for i, line in enumerate(source, 1) if text in line)


def test_a_second_output_shaped_like_weights_but_made_from_no_softmax_is_not_read_as_them():
    """T5's and Pix2Struct's layers return their position bias beside the output: 0s and 1s
    of the weights' shape, whose rows do not sum to 1. The recorded forward shows it computed
    from no softmax, so it is no weights, and the module is not failed on it."""
    found = diagnose(seeded_build(cm.ReturnsPositionBias), Config(mask="keep"))
    assert found.healthy, found.text()
    weights = next(f for f in found.findings if f.probe == "attention weights")
    assert weights.status == SKIP and "returns no weights" in weights.message, weights


def test_the_weights_a_written_out_softmax_returns_are_read_as_its_weights():
    """exp / sum of exp is a softmax too: the weights it returns are computed from a
    distribution, so they are read (and found to sum to 1), not dropped as a bias."""
    module, config = catalogue("naive_exp_softmax", "fixed")
    found = diagnose(module, config)
    weights = next(f for f in found.findings if f.probe == "attention weights")
    assert weights.status == PASS and "rows sum to 1" in weights.message, weights


def test_a_bias_added_in_place_and_clamped_is_read_as_the_mask_and_located_where_it_is_filled():
    """``scores += bias; scores = torch.max(scores, lowest)``: the in-place add and the clamp
    keep the scores' cells, so the mask is read; filled where the keep-mask keeps, it is
    mask_bool at the line that filled it, not where it was added."""
    config = Config(mask="keep", mask_shape="bk", mask_dtype="float")
    assert diagnose(seeded_build(cm.AddsInPlace), config).healthy
    found = diagnose(seeded_build(cm.AddsInPlace, inverted=True), config)
    assert [c.trap for c in found.causes] == ["mask_bool"], found.text()
    at = f"call_modules.py:{_line_of(cm, 'bias.masked_fill(bias == 0, lowest)')} "
    assert at in found.causes[0].at, found.causes[0]


def test_of_two_projections_drawn_by_the_modules_init_the_larger_draw_is_named_first(capsys):
    """Queries drawn with 0.5 and keys with 1.0: the keys' draw saturates the weights more,
    so the cause is at its line (the other init is beside it)."""
    code = cli.main(["doctor", f"{cm.__file__}:KeyDrawnLarge", "--mask", "keep"])
    said = capsys.readouterr().out.splitlines()
    assert code == 1 and said[1].startswith("FAIL  init_unit_variance"), said
    assert f"call_modules.py:{_line_of(cm, 'normal_(self.k_proj.weight, std=1.0)')} " in said[1]
