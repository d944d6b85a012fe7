"""The doctor's fixes: a named trap's line rewritten into the user's own code, shown only once
the rewritten code, diagnosed again, passes; the user's file never touched."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import libcst
import numpy as np
import pytest
import torch

from harness import cli
from harness.catalogue import registry
from harness.doctor import Config, diagnose
from harness.doctor.examine import called_once
from harness.doctor.findings import FAIL, PASS, Diagnosis, Finding
from harness.doctor.fixes import propose, prove, recipes
from harness.doctor.fixes.line import Line
from harness.doctor.fixes.live import owners, recompiled, swapped
from harness.doctor.fixes.recipes import RECIPES, mask_bool, softmax_dim
from harness.doctor.target import Sizes, load_object
from harness.doctor.target import build as build_target
from harness.validation import build as build_pair
from harness.validation import config_for
from tests import doctor_modules as dm
from tests import fix_modules as fm
from tests import generation_modules as gm
from tests.helpers import TUTORIAL_EDITS
from tests.test_probes import make

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "pitfalls" / "tutorial.py"

# each student's edit, and the softmax called without its dim
EDITS = [*TUTORIAL_EDITS, ("softmax_dim", "F.softmax(scores, dim=-1)", "F.softmax(scores)")]
IDS = [*(edit[0] for edit in TUTORIAL_EDITS), "softmax_no_dim"]
CONFIG = Config(mask="keep")
SIZES = Sizes(64, 4)


def _built(target: str) -> torch.nn.Module:
    """``target`` imported and built as the doctor builds it, with the doctor's seed."""
    return build_target(load_object(target), SIZES, 0)


def _edited(tmp_path: Path, written: str, edit: str, name: str = "attention.py") -> Path:
    source = TUTORIAL.read_text()
    assert source.count(written) == 1
    path = tmp_path / name
    path.write_text(source.replace(written, edit))
    return path


def _outputs(path: Path) -> torch.Tensor:
    """The tutorial's MultiHeadAttention of ``path``, built with the doctor's seed, on one
    input under a keep mask."""
    spec = importlib.util.spec_from_file_location(f"fixed_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    layer = build_target(module.MultiHeadAttention, SIZES, 0).eval()
    x = torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(1))
    keep = torch.ones(2, 8, 8, dtype=torch.bool).tril()
    with torch.no_grad():
        return layer(x, keep)


@pytest.mark.parametrize(("trap", "written", "edit"), EDITS, ids=IDS)
def test_a_students_edit_gets_a_proven_fix_that_gives_back_the_tutorials_outputs(
    tmp_path, trap, written, edit
):
    path = _edited(tmp_path, written, edit)
    target = f"{path}:MultiHeadAttention"
    d = diagnose(_built(target), CONFIG, target)
    assert not d.healthy and d.causes[0].trap == trap, d.text()
    fixes = propose(
        d,
        lambda: diagnose(_built(target), CONFIG, target),
        lambda seq_len=None, unpadded=False: called_once(
            _built(target), CONFIG, seq_len=seq_len, unpadded=unpadded
        ),
    )
    [fix] = fixes.fixes
    assert fix.trap == trap and fix.proof == "with this change every probe passes"
    line = TUTORIAL.read_text()[: TUTORIAL.read_text().index(written)].count("\n") + 1
    assert fix.number == line and fix.before != fix.after
    patched = tmp_path / "patched.py"
    patched.write_text(fixes.sources[path.resolve()])
    torch.testing.assert_close(_outputs(patched), _outputs(TUTORIAL), rtol=1e-5, atol=1e-6)


def test_fix_writes_a_diff_that_applies_and_leaves_the_users_file_as_it_was(
    tmp_path, capsys, monkeypatch
):
    path = _edited(tmp_path, "F.softmax(scores, dim=-1)", "F.softmax(scores, dim=1)")
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    out = tmp_path / "fix.diff"
    monkeypatch.chdir(tmp_path)
    code = cli.main(["doctor", "attention.py:MultiHeadAttention", "--mask", "keep",
                     "--fix", "fix.diff"])  # fmt: skip
    said = capsys.readouterr().out
    assert code == 1
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    assert (
        "fix (softmax_dim) at attention.py:34, proven: with this change every probe passes" in said
    )
    assert "+ weights = F.softmax(scores, dim=-1)" in said
    diff = out.read_text()
    assert diff.startswith("--- a/attention.py\n+++ b/attention.py\n"), diff
    assert "-        weights = F.softmax(scores, dim=1)" in diff
    assert "+        weights = F.softmax(scores, dim=-1)" in diff
    applied = subprocess.run(["git", "apply", "--check", "-p1", str(out)], cwd=tmp_path,
                             capture_output=True, text=True)  # fmt: skip
    assert applied.returncode == 0, applied.stderr


def test_fix_writes_nothing_where_nothing_is_proven(tmp_path, capsys):
    out = tmp_path / "fix.diff"
    code = cli.main(["doctor", f"{TUTORIAL}:MultiHeadAttention", "--mask", "keep",
                     "--fix", str(out)])  # fmt: skip
    assert code == 0 and not out.exists()
    assert "--fix: no proven fix, so nothing was written" in capsys.readouterr().err


def test_fix_to_a_folder_is_refused_before_any_probe_runs(tmp_path, capsys):
    code = cli.main(["doctor", f"{TUTORIAL}:MultiHeadAttention", "--fix", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "--fix" in err and len(err.strip().splitlines()) == 1, err


def test_a_rewrite_is_shown_only_when_the_code_it_makes_passes(tmp_path):
    """The proof decides: a rediagnosis that still names the trap, or that fails a probe
    which passed, shows no fix; one that passes shows it."""
    path = _edited(tmp_path, "F.softmax(scores, dim=-1)", "F.softmax(scores, dim=1)")
    target = f"{path}:MultiHeadAttention"
    d = diagnose(_built(target), CONFIG, target)
    assert not propose(d, lambda: d).fixes  # the same diagnosis again: nothing fixed
    failing = [f for f in d.findings if f.status == FAIL]
    one_less = [dataclasses.replace(f, status=PASS) if f is failing[0] else f for f in d.findings]
    fewer = dataclasses.replace(d, findings=one_less)
    assert len(failing) > 1 and not propose(d, lambda: fewer).fixes  # the trap still named
    passed = next(f for f in d.findings if f.status == PASS)
    others = [dataclasses.replace(f, status=PASS) for f in d.findings if f is not passed]
    broke = dataclasses.replace(d, findings=[*others, Finding(passed.probe, FAIL, "broken")],
                                causes=[])  # fmt: skip
    assert not propose(d, lambda: broke).fixes  # the trap gone, another probe broken
    unnamed = dataclasses.replace(d, findings=[dataclasses.replace(f, traps=())
                                               for f in d.findings], causes=[])  # fmt: skip
    assert not propose(d, lambda: unnamed).fixes  # the same failures, only no longer named
    cause = d.causes[0]
    renamed = dataclasses.replace(unnamed, causes=[dataclasses.replace(cause, trap="other")])
    assert not propose(d, lambda: renamed).fixes  # the same failures, renamed where they were
    number = int(cause.at.split(" ")[0].rsplit(":", 1)[1])
    elsewhere = cause.at.replace(f":{number} ", f":{number - 4} ", 1)
    revealed = dataclasses.replace(unnamed, causes=[dataclasses.replace(cause, trap="other",
                                                                        at=elsewhere)])  # fmt: skip
    [fix] = propose(d, lambda: revealed).fixes  # another fault, at another line, shows now
    assert fix.proof == "this change fixes softmax_dim; still failing: other"
    other = dataclasses.replace(cause, trap="other", at=elsewhere)
    still = dataclasses.replace(fewer, causes=[*fewer.causes, other])
    assert not propose(d, lambda: still).fixes  # the trap still named, beside another fault
    broke_too = dataclasses.replace(broke, causes=[other])
    assert not propose(d, lambda: broke_too).fixes  # another fault shows, and a probe broke
    healthy = dataclasses.replace(d, findings=[dataclasses.replace(f, status=PASS)
                                               for f in d.findings], causes=[])  # fmt: skip
    [fix] = propose(d, lambda: healthy).fixes
    assert fix.proof == "with this change every probe passes"


@pytest.mark.parametrize(
    ("line", "fixed"),
    [
        ("w = F.softmax(s)\n", "w = F.softmax(s, dim=-1)\n"),
        ("w = F.softmax(s, 1)\n", "w = F.softmax(s, -1)\n"),
        ("w = s.softmax(dim=0)  # note\n", "w = s.softmax(dim=-1)  # note\n"),
        ("w = s.softmax(1)\n", "w = s.softmax(-1)\n"),
    ],
)
def test_the_softmax_fix_reads_the_function_form_from_what_its_names_are(line, fixed):
    names = {"F": torch.nn.functional}
    assert next(softmax_dim(Line(line, 1, names))) == fixed


@pytest.mark.parametrize(
    ("line", "fixed"),
    [
        ("s = s.masked_fill(m == 1, x)\n", "s = s.masked_fill(m == 0, x)\n"),
        ("s = s.masked_fill(~m, x)\n", "s = s.masked_fill(m, x)\n"),
        ("s = s.masked_fill(m, x)\n", "s = s.masked_fill(~m, x)\n"),
        ("s = s.masked_fill(m != 0, x)\n", "s = s.masked_fill(m == 0, x)\n"),
        ("s = s.masked_fill(a & b, x)\n", "s = s.masked_fill(~(a & b), x)\n"),
        ("s = torch.masked_fill(s, m > 0, x)\n", "s = torch.masked_fill(s, m <= 0, x)\n"),
        ("s = s.masked_fill(m.eq(1), x)\n", "s = s.masked_fill(m.eq(0), x)\n"),
    ],
)
def test_a_mask_is_read_the_other_way_round_in_the_users_own_form(line, fixed):
    assert next(mask_bool(Line(line, 1, {"torch": torch}))) == fixed


def test_the_doctor_never_imports_a_rewritten_file(tmp_path):
    """The proof runs the rewritten functions in place of the loaded ones, and puts the
    user's back after; no module of the rewritten source is ever imported (nothing is written
    beside the user's file)."""
    path = _edited(tmp_path, "F.softmax(scores, dim=-1)", "F.softmax(scores, dim=1)")
    target = f"{path}:MultiHeadAttention"

    def diagnosed():
        return diagnose(_built(target), CONFIG, target)

    assert propose(diagnosed(), diagnosed).fixes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attention.py"]
    here = [m for m in list(sys.modules.values()) if getattr(m, "__file__", None)
            and Path(m.__file__).resolve().parent == tmp_path.resolve()]  # fmt: skip
    assert [Path(m.__file__).name for m in here] == ["attention.py"]  # the user's, loaded once
    assert diagnosed().causes[0].trap == "softmax_dim"  # the user's code runs again


def test_a_module_that_will_not_say_its_file_is_passed_over(tmp_path, monkeypatch):
    """An import stub that raises on any attribute (torchvision's, where no build fits) does
    not stop the search for the code a line belongs to."""

    class Stub(types.ModuleType):
        def __getattr__(self, name):
            raise NotImplementedError(f"stub: {name} is not available")

    load_object(f"{TUTORIAL}:MultiHeadAttention")
    monkeypatch.setitem(sys.modules, "stubbed_for_test", Stub("stubbed_for_test"))
    assert {o.name for o in owners(TUTORIAL, 34)} == {"forward"}


def test_a_fix_that_breaks_on_the_way_leaves_the_diagnosis_as_it_is(tmp_path, monkeypatch):
    """Whatever goes wrong while a fix is sought (a file that cannot be read, a recipe that
    raises), the diagnosis stands, without a fix."""
    path = _edited(tmp_path, "F.softmax(scores, dim=-1)", "F.softmax(scores, dim=1)")
    target = f"{path}:MultiHeadAttention"
    d = diagnose(_built(target), CONFIG, target)

    def broken(line):
        raise OSError("unreadable")

    monkeypatch.setitem(recipes.RECIPES, "softmax_dim", broken)
    assert propose(d, lambda: d).fixes == []


def _fixes(module, config):
    d = diagnose(module, config, type(module).__name__)
    assert not d.healthy, d.text()
    bare = dataclasses.replace(config, mask="none")
    return d, propose(
        d,
        lambda: diagnose(module, config, type(module).__name__),
        lambda seq_len=None, unpadded=False: called_once(
            module, config, seq_len=seq_len, unpadded=unpadded
        ),
        lambda: called_once(module, bare),
    ).fixes


def test_an_sdpa_call_given_no_mask_is_told_it_is_causal():
    """A shortcut that hands SDPA ``attn_mask=None`` and ``is_causal`` False leaks: the fix
    tells it ``is_causal=True``, and every probe passes."""
    module = dm.UnpaddedShortcut(64, 4, forgets=True)
    d, [fix] = _fixes(module, Config(causal=True, mask="keep", mask_shape="bk"))
    assert fix.trap == "causal_leak" and fix.proof == prove.EVERY, d.text()
    assert "is_causal=True" in " ".join(fix.after), fix


def test_every_fix_the_diff_holds_is_printed_one_found_after_another_too():
    """A fix proven only once an earlier one is in (its trap no cause of the first reading)
    is in the diff ``--fix`` writes, so the text prints it too."""
    d, [fix] = _fixes(fm.SplitScale(64, 4), Config())
    assert fix.trap in {c.trap for c in d.causes}, d.text()
    later = dataclasses.replace(fix, trap="missing_scale")  # as if found once ``fix`` was in
    shown = dataclasses.replace(d, fixes=[fix, later]).text()
    assert f"fix ({fix.trap}) at " in shown and "fix (missing_scale) at " in shown, shown


def test_a_change_that_leaves_failures_no_trap_explains_is_no_fix():
    """Inverting BLOOM's combined mask where it is filled stops it being read the wrong way
    round (mask_bool is no longer named) and leaves the causal part inverted: the probes
    still fail, for no trap, so the change is not shown as a fix."""
    config = Config(causal=True, mask="keep", mask_shape="bk", positions="relative")
    d, fixes = _fixes(fm.CombinedMaskPaddingTurned(64, 4), config)
    assert d.causes[0].trap == "mask_bool", d.text()
    assert all(f.proof == "with this change every probe passes" for f in fixes), fixes


def test_a_mask_that_may_be_none_is_fixed_where_it_is_made_not_where_it_is_used():
    """Inverting the mask at the SDPA call fixes the padding the probes pass, and breaks the
    call without one (~None), which the code as it is takes: that change is not shown; the
    one where the mask is built, inside ``if key_padding_mask is not None``, is."""
    config = Config(mask="drop", mask_shape="bk")
    d, [fix] = _fixes(dm.PaddingToSDPA(32, 4), config)
    assert d.causes[0].trap == "sdpa_mask_inverted", d.text()
    assert fix.before[0].strip() == "attn_mask = key_padding_mask[:, None, None, :]  # (B, 1, 1, T)"
    assert fix.after[0].strip() == "attn_mask = ~key_padding_mask[:, None, None, :]  # (B, 1, 1, T)"


def test_a_change_on_another_line_of_a_call_is_shown_on_that_line():
    config = Config(mask="drop", mask_shape="bk")
    d, fixes = _fixes(dm.PaddingToSDPA(32, 4, floats=True), config)
    [fix] = fixes
    assert fix.trap == "sdpa_float_mask" and len(fix.before) == len(fix.after) == 1
    assert (
        fix.before[0].strip() == "q, k, v, attn_mask=(~key_padding_mask)[:, None, None, :].float()"
    )
    assert fix.after[0].strip().endswith(".float().bool()"), fix.after
    assert d.causes[0].at.split(" ")[0].endswith(f":{fix.number - 1}")  # the call's first line


def test_a_scale_of_the_model_width_is_fixed_with_a_tensors_width_where_no_name_holds_it():
    _, [fix] = _fixes(dm.WidthScaled(32, 4), Config())
    assert fix.trap == "scale_d_model", fix
    assert fix.after[0].strip().endswith("(1.0 / math.sqrt(q.size(-1))), dim=-1)"), fix.after


F_NAMES = {"F": torch.nn.functional, "torch": torch, "nn": torch.nn}


RECIPE_CASES = [
    ("gqa_kv_grouping", "k = repeat(k, 'b h n d -> b (h r) n d', r=2)",
     "k = repeat(k, 'b h n d -> b (r h) n d', r=2)"),
    ("softmax_dim", "self.sm = nn.Softmax(dim=1)", "self.sm = nn.Softmax(dim=-1)"),
    ("causal_leak", "m = torch.tril(o, diagonal=1)", "m = torch.tril(o, diagonal=0)"),
    ("causal_leak", "m = o.triu(2)", "m = o.triu(1)"),
    ("causal_leak", "m = torch.triu(o)", "m = torch.triu(o, diagonal=1)"),
    ("causal_leak", "y = F.scaled_dot_product_attention(q, k, v)",
     "y = F.scaled_dot_product_attention(q, k, v, is_causal=True)"),
    ("fill_too_small", "s = s.masked_fill(m, -1e4)",
     "s = s.masked_fill(m, torch.finfo(s.dtype).min)"),
    ("fill_overflow_half", "s = torch.masked_fill(a + b, m, -1e9)",
     "s = torch.masked_fill(a + b, m, torch.finfo((a + b).dtype).min)"),
    ("qk_overflow_half", "s = (q @ k.mT) / math.sqrt(d)", "s = (q / math.sqrt(d)) @ k.mT"),
    ("qk_overflow_half", "s = torch.matmul(q, k) * c", "s = torch.matmul(q * c, k)"),
    ("scale_after_softmax", "w = F.softmax(s, dim=-1) / c", "w = F.softmax(s / c, dim=-1)"),
    ("scale_after_softmax", "w = s.softmax(-1) * c", "w = (s * c).softmax(-1)"),
    ("mask_rank", "m = torch.ones(1, 1, T, T).tril()", "m = torch.ones(1, T, T).tril()"),
    ("mask_rank", "m = mask[:, None, None, :]", "m = mask[:, None, :]"),
    ("mask_rank", "m = mask.unsqueeze(1)", "m = mask"),
    ("causal_leak", "ok = (dist >= -1) & (dist < w)", "ok = (dist >= 0) & (dist < w)"),
    ("padding_on_queries", "s = s.masked_fill(m[:, :, None] == 0, x)",
     "s = s.masked_fill(m[:, None, :] == 0, x)"),
    ("mask_bool", "keep = keep & (m[:, None] == 0)", "keep = keep & (m[:, None] == 1)"),
    ("mask_bool", "keep = causal & m.eq(0)", "keep = causal & m.eq(1)"),
    ("missing_scale", "s = b.baddbmm(q, k, beta=1.0)",
     "s = b.baddbmm(q, k, beta=1.0, alpha=q.size(-1) ** -0.5)"),
    ("missing_scale", "s = torch.baddbmm(b, q, k)",
     "s = torch.baddbmm(b, q, k, alpha=q.size(-1) ** -0.5)"),
    ("sliding_window_off_by_one", "r = ones.triu(S - T - self.window)",
     "r = ones.triu(S - T - self.window + 1)"),
    ("sliding_window_off_by_one", "r = torch.tril(o, diagonal=-3)",
     "r = torch.tril(o, diagonal=-2)"),
    ("sliding_window_off_by_one", "far = i - j > w", "far = i - j >= w"),
    ("sliding_window_off_by_one", "far = (i - j) >= 4", "far = (i - j) >= 5"),
    ("padding_on_queries", "m = repeat(m, 'b j -> (b h) j ()', h=h)",
     "m = repeat(m, 'b j -> (b h) () j', h=h)"),
    ("padding_on_queries", "s = s + m.transpose(-1, -2)", "s = s + m"),
    ("padding_on_queries", "m = rearrange(m, 'b j -> b 1 j 1')",
     "m = rearrange(m, 'b j -> b 1 1 j')"),
    ("padding_on_queries", "m = m.unsqueeze(1).unsqueeze(3)", "m = m.unsqueeze(1).unsqueeze(2)"),
    ("head_split_view", "q = q.view(B, h, T, d)", "q = q.view(B, T, h, d).transpose(1, 2)"),
    ("head_split_view", "t = x.reshape(B * h, T, d)",
     "t = x.reshape(B, T, h, d).transpose(1, 2).reshape(B * h, T, d)"),
    ("mask_to_additive_nan", "a = (1 - m) * -math.inf",
     "a = torch.zeros_like(1 - m).masked_fill((1 - m) != 0, -math.inf)"),
    ("mask_bool", "adder = m * -1e9", "adder = (1.0 - m) * -1e9"),
    ("mask_bool", "adder = (1 - m) * -1e9", "adder = m * -1e9"),
    ("fill_too_small", "w = torch.where(c, w, -1e4)",
     "w = torch.where(c, w, torch.finfo(w.dtype).min)"),
    ("fill_too_small", "fill = -1e4", 'fill = float("-inf")'),
    ("head_merge_no_transpose", "o = o.contiguous().view(T, B, E)",
     "o = o.transpose(1, 2).contiguous().view(T, B, E)"),
    ("cache_causal_alignment", "c = self.bias[:, :, :q_len, :k_len]",
     "c = self.bias[:, :, k_len - q_len : k_len, :k_len]"),
    ("cache_causal_alignment", "c = torch.tril(ones)",
     "c = torch.tril(ones, diagonal=ones.size(-1) - ones.size(-2))"),
    ("cache_causal_alignment", "c = ones.triu(1)",
     "c = ones.triu(ones.size(-1) - ones.size(-2) + 1)"),
    ("cache_causal_alignment", "o = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1)",
     "o = F.scaled_dot_product_attention(q, k, v, is_causal=(T > 1) and q.size(-2) == k.size(-2))"),
    ("rope_cache_offset", "f = freqs[:, :seq_len, :]", "f = freqs[:, -seq_len:, :]"),
    ("rope_cache_offset", "f = freqs[: t - 1]", "f = freqs[-(t - 1):]"),
]  # fmt: skip


@pytest.mark.parametrize(("trap", "source", "fixed"), RECIPE_CASES)
def test_each_recipe_rewrites_the_users_own_form(trap, source, fixed):
    candidates = list(RECIPES[trap](Line(source + "\n", 1, F_NAMES)))
    assert candidates[0] == fixed + "\n", candidates


def test_a_node_replaced_in_its_statement_gives_the_file_the_whole_module_gives():
    """A rewrite writes again only the statement of the module that holds the node: for every
    call of a file of many classes, the text is the one the whole module rewritten gives."""
    whole_file = Path(fm.__file__).read_text()
    source = "\n\n\nclass ".join(whole_file.split("\n\n\nclass ")[:6]) + "\n"  # five classes
    calls = [n for n, text in enumerate(source.splitlines(), 1) if "(" in text]
    checked = 0
    for number in calls:
        line = Line(source, number, {})
        for call in line.nodes(libcst.Call):
            whole = line._wrapper.module.deep_replace(call, libcst.Name("changed")).code
            assert line.replaced(call, libcst.Name("changed")) == whole, number
            checked += 1
    assert checked > 50


def test_a_small_negative_constant_is_not_taken_for_a_fill():
    """A line that makes a fill: a large negative constant on it is put as -inf; a small one
    (an offset, a diagonal) is arithmetic, left alone."""
    assert list(recipes.finite_fill(Line("d = -1\n", 1, F_NAMES))) == []
    made = list(recipes.finite_fill(Line("fill = -1e9\n", 1, F_NAMES)))
    assert made == ['fill = float("-inf")\n']


def test_only_a_whole_size_is_offered_its_square_root():
    """``s / n * t``: n, a size worth 16 when the line runs, is offered as ``n ** 0.5``; t, a
    fraction, and s, a tensor, are not sizes."""
    worth = {"s": torch.ones(2, 2), "n": 16, "t": 0.3}
    line = Line("w = s / n * t\n", 1, F_NAMES, lambda names: {n: worth[n] for n in names})
    offered = list(recipes.double_scale(line))
    assert "w = s / n ** 0.5 * t\n" in offered, offered
    assert not any("t ** 0.5" in o or "s ** 0.5" in o for o in offered), offered


def test_a_fix_offered_from_a_branch_the_probes_never_take_is_not_shown():
    """The key padding mask is read where it is merged with an attention mask, in a branch a
    call with the padding alone never takes: inverting it where it is made would pass every
    probe and break the call with both masks. No line the probes' call skips offers a fix."""
    config = Config(mask="drop", mask_shape="bk", mask_arg="key_padding_mask")
    d, fixes = _fixes(fm.TwoMasksOneInverted(64, 4), config)
    assert d.causes[0].trap == "mask_bool", d.text()
    assert not any("key_padding_mask = ~" in "".join(f.after) for f in fixes), fixes


def test_a_windows_bound_is_moved_both_ways():
    """One key too many or too few: the proof picks, so both are offered."""
    moved = list(recipes.window_bound(Line("r = o.tril(diagonal=-3)\n", 1, F_NAMES)))
    assert moved == ["r = o.tril(diagonal=-2)\n", "r = o.tril(diagonal=-4)\n"]


PAIR = """def forward(self, x):
    q, k, v = self.qkv(x).chunk(3, -1)
    q, v = rotate(q, v, cos, sin)
"""


def test_a_rotary_pair_is_given_only_a_tensor_made_beside_it():
    """``q, v = rotate(q, v)``: v is put as k (made with it, not rotated here); q, already
    rotated on the line, is never put as v's stand-in."""
    offered = [c.splitlines()[2].strip() for c in recipes.rope_on_value(Line(PAIR, 3, F_NAMES))]
    assert "q, k = rotate(q, k, cos, sin)" in offered, offered
    assert not any(line.startswith(("q, q", "v, v")) for line in offered), offered


METHOD = """class A(nn.Module):
    def forward(self, q, k, v, w):
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p)
        w = F.dropout(w, 0.1)
        k, v = k.repeat(1, self.n, 1, 1), v.repeat(1, self.n, 1, 1)
        s = self.softmax(s) / c
        return y
"""


@pytest.mark.parametrize(
    ("trap", "number", "written"),
    [
        (
            "dropout_in_eval",
            3,
            "y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training "
            "else 0.0)",
        ),
        ("dropout_in_eval", 4, "w = F.dropout(w, 0.1, training=self.training)"),
        (
            "gqa_kv_grouping",
            5,
            "k, v = k.repeat_interleave(self.n, dim=1), v.repeat_interleave(self.n, dim=1)",
        ),
        ("scale_after_softmax", 6, "s = self.softmax(s / c)"),  # the layer is given s
    ],
)
def test_a_method_is_fixed_with_what_its_instance_knows(trap, number, written):
    [candidate] = RECIPES[trap](Line(METHOD, number, F_NAMES))
    assert candidate.splitlines()[number - 1].strip() == written
    free = textwrap.dedent(METHOD.split("\n", 1)[1])  # a plain function: no instance to ask
    assert trap != "dropout_in_eval" or list(RECIPES[trap](Line(free, number - 1, F_NAMES))) == []


ORIGINS = """class Inner(nn.Module):
    def __init__(self, temperature, p=0.1):
        super().__init__()
        self.temperature = temperature
        self.other = p

    def forward(self, s):
        scale = 1 / self.temperature
        return s * scale


class Outer(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.inner = Inner(
            temperature=d ** 0.5)
        self.unrelated = Inner(1.0)
"""


def test_a_line_reading_self_leads_to_where_that_is_made_and_to_what_made_it():
    """``s * scale``: where the local ``scale`` is assigned; ``1 / self.temperature``: where
    ``self.temperature`` is assigned, then where the file builds the class with the argument
    it is assigned from (by keyword or position)."""
    assert Line(ORIGINS, 9, {}).origins() == [8]
    assert Line(ORIGINS, 8, {}).origins() == [4, 16, 17]
    assert Line(ORIGINS, 15, {}).origins() == []  # reads nothing made elsewhere


REASSIGNED = """def forward(self, x, p):
    attn = x @ x.transpose(-2, -1)
    attn = attn.softmax(dim=-1)
    out = attn @ x
    drop = F.dropout(attn, p)
    return out + F.dropout(x, p) + drop
"""


def test_a_value_read_on_two_lines_is_shared_but_a_name_assigned_again_is_another_value():
    """``p`` is read by two calls: fixed where it is made (here, nowhere: a parameter). The
    ``attn`` line 4 reads is the one assigned on line 3, read again on line 5: shared; the one
    assigned on line 2 is read only where line 3 replaces it: not shared with line 4."""
    assert Line(REASSIGNED, 4, {}).shared_origins() == [3]
    assert Line(REASSIGNED, 3, {}).shared_origins() == []
    alone = REASSIGNED.replace("    drop = F.dropout(attn, p)\n", "    drop = 0\n")
    assert Line(alone, 4, {}).shared_origins() == []


def test_a_change_after_which_the_reading_shows_less_of_the_layout_proves_nothing():
    """A rewrite that moves the scores' axes where the reading cannot follow them makes a
    trap read from the layout vanish: not a fix. The same diagnosis with the layout still
    read proves it."""
    config = Config(call=fm.on_grid, positions="relative")
    before = diagnose(fm.GridMergedStraight(64, 4), config, "grid")
    trap = before.causes[0].trap
    healthy = dataclasses.replace(before, findings=[f for f in before.findings if f.status != FAIL],
                                  causes=[])  # fmt: skip
    assert prove._proof(before, healthy, trap, lambda where: False) == prove.EVERY
    blind = [f for f in healthy.facts if f.name != "queries' axis"]
    assert prove._proof(before, dataclasses.replace(healthy, facts=blind), trap,
                        lambda where: False) is None  # fmt: skip


def test_a_change_that_stops_turning_by_position_proves_nothing():
    """Values turned with the queries and keys before their projections: leaving the turn
    out altogether clears rope_on_value and every probe passes, since a module without
    positions is healthy; it stops turning q and k, which no trap's fix does, so it is no
    fix. Leaving out the values' share of the turn is one."""
    config = Config(positions="absolute")
    before = diagnose(fm.TurnedBeforeProjecting(64, 4), config)
    twin = diagnose(fm.TurnedBeforeProjecting(64, 4, turn_values=False), config)
    unturned = [f for f in twin.facts if f.name != "rotary before the projections"]
    assert prove._proof(before, twin, "rope_on_value", lambda where: False) == prove.EVERY
    assert prove._proof(before, dataclasses.replace(twin, facts=unturned), "rope_on_value",
                        lambda where: False) is None  # fmt: skip


def _bug_line(name: str) -> int:
    """The line of ``fix_modules``' class ``name`` marked ``# BUG``."""
    source = Path(fm.__file__).read_text().splitlines()
    start = next(i for i, text in enumerate(source) if text.startswith(f"class {name}("))
    return next(i for i, text in enumerate(source[start:], start + 1) if text.endswith("# BUG"))


@pytest.mark.parametrize(("declared", "at"), [
    ("half", "emb = torch.repeat_interleave(freqs, 2, dim=-1)"),
    ("interleaved", "return torch.cat((-x2, x1), dim=-1)"),
])  # fmt: skip
def test_a_turn_and_its_table_paired_apart_are_named_at_the_one_not_declared(declared, at):
    """rotate_half with a table repeated for pairs: declared halves, the table is off;
    declared pairs, the turn is, located where it turns the halves."""
    config = Config(positions="relative", rope_pairing=declared, rotary_dims=8)
    d = diagnose(fm.TableForOtherPairs(64, 4), config)
    first = d.causes[0]
    assert first.trap == "rope_pairing_mismatch" and at in first.at, d.text()


def test_of_two_rotations_the_one_not_in_the_declared_pairing_is_named():
    """q turned in halves as declared, k in pairs: the cause is at k's call, not q's."""
    d = diagnose(fm.RotaryFlagDiffers(64, 4),
                 Config(causal=True, positions="relative", rope_pairing="half"))  # fmt: skip
    [cause] = [c for c in d.causes if c.trap == "rope_pairing_mismatch"]
    assert f"fix_modules.py:{_bug_line('RotaryFlagDiffers')} " in cause.at, d.text()


def test_a_pairing_is_read_of_the_dimensions_as_projected_not_as_turned():
    """q and k each reordered from pairs to halves, then turned in halves: pairs, as declared,
    and healthy; the queries' reordering left out: they are turned in halves of their
    dimensions as projected, which no probe can see, and the reading fails it by itself."""
    config = Config(causal=True, positions="relative", rope_pairing="interleaved")
    assert diagnose(fm.PairsTurnedAsHalves(64, 4), config).healthy
    d = diagnose(fm.QueriesLeftInPairs(64, 4), config)
    assert d.causes[0].trap == "rope_pairing_mismatch", d.text()
    assert "the queries are turned in halves" in d.causes[0].fit, d.causes[0]


def test_nan_in_an_added_mask_is_named_where_it_is_made_not_where_it_is_sliced():
    """A bool window times -inf (0 * -inf: NaN) added to its model's mask, which is sliced
    before it meets the scores: the cause is at the product that made the NaN."""
    config = Config(causal=True, mask="additive", mask_shape="b1qk", window=4)
    d = diagnose(fm.WindowTimesInfinity(64, 4), config)
    assert d.causes[0].trap == "mask_to_additive_nan", d.text()
    assert f"fix_modules.py:{_bug_line('WindowTimesInfinity')} " in d.causes[0].at, d.text()


@pytest.mark.parametrize(
    ("module", "config"),
    [
        (fm.ScaledByModelWidthForMuP(64, 4), Config(causal=True, scale=1 / 16)),
        (fm.QueriesOnlyScaled(64, 4), Config()),
    ],
    ids=["mup-by-model-width", "queries-only-scaled"],
)
def test_a_change_that_trades_one_wrong_scale_for_another_is_no_fix(module, config):
    """Jais's muP scale by the model's width against a declared 1/d reads as the scale applied
    twice, Whisper's split scale left off the keys as a wrong one; taking the one factor away
    leaves no scale at all, another wrong scale, which nothing after it puts right: no fix."""
    d, fixes = _fixes(module, config)
    assert d.causes[0].trap in {"double_scale", "wrong_scale"}, d.text()
    assert fixes == [], fixes


def test_a_float_mask_given_to_sdpa_is_named_with_the_line_that_cast_it():
    """A bool padding mask cast to floats in ``forward``, sliced after, and given to SDPA by a
    helper: the cause is at the call, and the line it involves is the cast, not the slice."""
    d = diagnose(fm.MaskCastBeforeTheCall(64, 4), Config(mask="keep", mask_shape="bk"))
    assert d.causes[0].trap == "sdpa_float_mask", d.text()
    [cast] = d.causes[0].also
    assert f"fix_modules.py:{_bug_line('MaskCastBeforeTheCall')} " in cast, d.causes[0]


def test_a_factor_a_normalization_undoes_is_no_part_of_the_scale():
    """q scaled before its RMS norm and the scores scaled once after it: the factor before the
    norm is undone by it, so the scale read is 1/sqrt(head width) and the layer is healthy."""
    d = diagnose(fm.NormedAfterScaled(64, 4), Config())
    assert d.healthy, d.text()
    assert any(f.name == "scale" and f.value.startswith("0.25 ") for f in d.facts), d.text()


def test_grouped_heads_behind_a_fused_projection_are_followed_in_the_recorded_forward():
    """No separate K/V projections to hook: which query heads share one copy of the values is
    read from the recorded forward, and a tiled copy fails against declared blocks."""
    config = Config(causal=True, kv_heads=2, kv_grouping="blocks")
    d = diagnose(fm.MultiQueryGroupsTiled(64, 4), config)
    [grouped] = [f for f in d.findings if f.probe == "grouped heads"]
    assert grouped.status == FAIL and "(as recorded)" in grouped.message, d.text()
    assert "gqa_kv_grouping" in grouped.traps


@pytest.mark.parametrize(
    ("module", "written"),
    [
        (gm.BufferCutTopLeft, "causal = self.bias[S - T : S, :S]"),
        (
            gm.SdpaIsCausalForOne,
            "q, keys, values, attn_mask=allowed, "
            "is_causal=is_causal and q.size(-2) == keys.size(-2)",
        ),
    ],
)
def test_a_mask_anchored_top_left_under_a_cache_is_fixed_where_it_is_made(module, written):
    """GPT-2's buffer cut at its first rows: the last ones; SDPA told is_causal for one new
    token: told so only where queries and keys are as many. Each proven by the cached calls."""
    d, [fix] = _fixes(make(module), Config(causal=True))
    assert fix.trap == "cache_causal_alignment" and fix.proof == prove.EVERY, (fix, d.text())
    assert fix.after[0].strip() == written, fix


FIXABLE = [
    "softmax_dim", "mask_bool", "causal_leak", "scale_after_softmax", "fill_too_small",
    "qk_overflow_half", "gqa_kv_grouping", "dropout_in_eval", "missing_scale", "scale_d_model",
    "double_scale", "transpose", "head_merge_no_transpose", "rope_on_value", "sdpa_float_mask",
    "sdpa_mask_inverted", "fill_overflow_half", "mask_rank", "padding_on_queries",
    "sliding_window_off_by_one", "mask_to_additive_nan", "cache_causal_alignment",
]  # fmt: skip
DECLARED = {"fill_overflow_half": {"dtype": "float16"}}  # how a user of the pair would run it


@pytest.mark.parametrize("trap", FIXABLE)
def test_each_catalogue_bug_gets_a_proven_fix_that_computes_what_its_fixed_twin_does(trap):
    """The pair's buggy.py, fixed by the doctor, computes what its fixed.py computes, and the
    proof says what the fixed twin's own diagnosis says (fill_overflow_half's twin still
    overflows its product in float16, as the catalogue's pair means it to)."""
    pair = registry.load(trap)
    config = config_for(pair.card, **DECLARED.get(trap, {}))

    def diagnosed(side="buggy"):
        return diagnose(build_pair(pair, side), config, trap)

    d = diagnosed()
    assert d.causes and d.causes[0].trap == trap, d.text()
    fixes = propose(d, diagnosed, lambda seq_len=None, unpadded=False: called_once(
        build_pair(pair, "buggy"), config, seq_len=seq_len, unpadded=unpadded), most=1)  # fmt: skip
    [fix] = fixes.fixes
    twin = diagnosed("fixed")
    left = ", ".join(c.trap for c in twin.causes if c.trap)
    assert fix.trap == trap and fix.proof == (
        "with this change every probe passes"
        if twin.healthy
        else f"this change fixes {trap}; still failing: {left}"
    ), (fix, twin.text())
    [(path, source)] = fixes.sources.items()
    rewritten = [(o, recompiled(o, source, path, fix.number)) for o in owners(path, fix.number)]
    with swapped(rewritten):
        [patched, *_] = called_once(build_pair(pair, "buggy"), config)
    [fixed, *_] = called_once(build_pair(pair, "fixed"), config)
    torch.testing.assert_close(patched, fixed, rtol=1e-5, atol=1e-6)


MADE_IN_INIT = """import torch
from torch import nn


class Scaled(nn.Module):
    def __init__(self, temperature):
        super().__init__()
        self.temperature = temperature
        self.softmax = nn.Softmax(dim={dim})

    def forward(self, q, k, v):
        weights = self.softmax(q @ k.transpose(1, 2) / self.temperature)
        return weights @ v


class Heads(nn.Module):
    def __init__(self, d_model, n_head):
        super().__init__()
        self.n_head, self.d_k = n_head, d_model // n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.attention = Scaled(temperature={width} ** 0.5)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3 * self.n_head, self.d_k).transpose(1, 2).chunk(3, 1)
        out = self.attention(*(t.reshape(B * self.n_head, T, self.d_k) for t in (q, k, v)))
        return out.view(B, self.n_head, T, self.d_k).transpose(1, 2).reshape(B, T, C)
"""


@pytest.mark.parametrize(
    ("dim", "width", "trap", "line", "written"),
    [
        (1, "self.d_k", "softmax_dim", 9, "self.softmax = nn.Softmax(dim=-1)"),
        (
            -1,
            "d_model",
            "scale_d_model",
            21,
            "self.attention = Scaled(temperature=self.d_k ** 0.5)",
        ),
    ],
)
def test_what_the_forward_reads_from_self_is_fixed_where_it_is_made(
    tmp_path, dim, width, trap, line, written
):
    """The forward's line reads ``self.softmax`` or ``self.temperature``; the fix is where the
    constructor makes it, or where the model builds the layer with the argument it is made
    from, proven on modules built again from the rewritten constructors."""
    path = tmp_path / "made.py"
    path.write_text(MADE_IN_INIT.format(dim=dim, width=width))
    target = f"{path}:Heads"
    d = diagnose(_built(target), Config(), target)
    assert d.causes[0].trap == trap and d.causes[0].at.split(" ")[0].endswith(":12"), d.text()
    [fix] = propose(
        d,
        lambda: diagnose(_built(target), Config(), target),
        lambda seq_len=None, unpadded=False: called_once(
            _built(target), Config(), seq_len=seq_len, unpadded=unpadded
        ),
    ).fixes
    assert (fix.number, fix.after[0].strip()) == (line, written), fix
    assert fix.proof == "with this change every probe passes"


FREE_DROPOUT = """import math

import torch.nn.functional as F
from torch import nn


def attend(q, k, v):
    weights = F.softmax(q @ k.transpose(1, 2) / math.sqrt(q.size(-1)), dim=-1)
    return F.dropout(weights, 0.5) @ v


class Attention(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(d_model, d_model) for _ in range(3))

    def forward(self, x):
        return attend(self.q(x), self.k(x), self.v(x))
"""


def test_a_cause_with_no_proven_fix_says_where_the_change_is_shown(tmp_path, capsys):
    """A functional dropout left on in a plain function has no module whose ``training`` to
    read: no fix is guessed, and the cause points at the catalogue's pair instead."""
    path = tmp_path / "free.py"
    path.write_text(FREE_DROPOUT)
    code = cli.main(["doctor", f"{path}:Attention"])
    said = capsys.readouterr().out
    assert code == 1 and said.splitlines()[1].startswith("FAIL  dropout_in_eval"), said
    assert (
        "no fix proven; the catalogue's change: diff pitfalls/dropout_in_eval/buggy.py "
        "pitfalls/dropout_in_eval/fixed.py" in said
    ), said


def test_what_one_whole_fix_clears_is_shown_under_its_cause():
    """A causal triangle a diagonal off fails float16 too, which no reading of the mask
    explains; its fix alone makes every probe pass, so that failure is shown under it, one
    problem in all. A fix that leaves probes failing folds nothing."""
    module, config = fm.TriangleInPlaceBeforeFold(64, 4), Config(causal=True)
    d = diagnose(module, config, "triangle")
    assert "float16 robustness" not in d.causes[0].probes and d.problems > 1, d.text()
    found = propose(d, lambda: diagnose(module, config, "triangle"),
                    lambda seq_len=None, unpadded=False: called_once(
            module, config, seq_len=seq_len, unpadded=unpadded
        ))  # fmt: skip
    partial = dataclasses.replace(found.fixes[0], proof="this change fixes causal_leak; ...")
    kept = list(d.causes)
    dataclasses.replace(found, fixes=[partial]).onto(d)
    assert d.causes == kept, d.text()
    found.onto(d)
    failing = {f.probe for f in d.findings if f.status == FAIL}
    assert [c.trap for c in d.causes] == ["causal_leak"], d.text()
    assert failing <= set(d.causes[0].probes) and d.problems == 1, d.text()


@pytest.mark.parametrize(
    ("name", "written"),
    [
        ("DrawnWithUnitSpread", "nn.init.normal_(self.Wqkv.weight, mean=0.0, std=self.init_std)"),
        ("DrawnWithUnitSpreadLikeTimm", "nn.init.normal_(self.qkv.weight, std=0.02)"),
        ("DrawnWithUnitSpreadGated", "nn.init.xavier_uniform_(weights)"),
        ("DrawnWithUnitSpreadScaledOut", "    nn.init.normal_(linear.weight, mean=0.0, std=0.02)"),
        (
            "DrawnWithUnitSpreadFromConfig",
            "nn.init.normal_(self.Wqkv.weight, mean=0.0, std=config.initializer_range)",
        ),
    ],
)
def test_projections_drawn_with_a_unit_spread_are_redrawn_as_the_module_draws_the_others(
    tmp_path, capsys, name, written
):
    """A fused projection drawn from normal(0, 1) in ``__init__``, where the output's is drawn
    with the module's own ``init_std`` (or timm's 0.02): the init is located where the doctor
    watched it written, and the spread the function's other init draws with is the proven
    fix, not another small number in scope (the scale, 0.25, passes the probes too)."""
    out = tmp_path / "fix.diff"
    code = cli.main(["doctor", f"{fm.__file__}:{name}", "--fix", str(out)])
    said = capsys.readouterr().out
    assert code == 1 and said.splitlines()[1].startswith("FAIL  init_unit_variance"), said
    assert "with this change every probe passes" in said, said
    assert f"+        {written}  # BUG" in out.read_text(), out.read_text()


def test_a_t5_init_is_not_redrawn_with_the_half_of_an_exponent(tmp_path, capsys):
    """T5's spreads are ``factor * d ** -0.5``: the 0.5 raises to a power and is no spread
    (it passes the probes, and is 4x off). Its queries fold the scale in, so which of the
    others' spreads is the keys' own is not known from them: the catalogue's draw is proven."""
    out = tmp_path / "fix.diff"
    code = cli.main(["doctor", f"{fm.__file__}:DrawnWithUnitSpreadLikeT5", "--scale", "none",
                     "--fix", str(out)])  # fmt: skip
    said = capsys.readouterr().out
    assert code == 1 and said.splitlines()[1].startswith("FAIL  init_unit_variance"), said
    diff = out.read_text()
    assert "+        nn.init.xavier_uniform_(self.k.weight)  # BUG" in diff, diff
    assert "std=0.5" not in diff, diff


def test_an_init_whose_spread_a_helper_is_handed_is_fixed_where_the_class_calls_it(
    tmp_path, capsys
):
    """A helper that hands ``std=std`` on draws the fused projection with 1.0 and a table with
    0.02: rewriting the helper would redraw both, so the fix is at the line of the class that
    called it, with the spread its other call draws with; the helper is left as it is."""
    out = tmp_path / "fix.diff"
    code = cli.main(["doctor", f"{fm.__file__}:DrawnByHelperWithUnitSpread", "--fix", str(out)])
    said = capsys.readouterr().out
    assert code == 1 and said.splitlines()[1].startswith("FAIL  init_unit_variance"), said
    assert "with this change every probe passes" in said, said
    diff = out.read_text()
    assert "+        trunc_normal_(self.qkv.weight, std=0.02)  # BUG" in diff, diff
    assert "return nn.init.trunc_normal_" not in diff, diff


def test_an_init_written_through_data_is_located_where_it_was_last_written(capsys):
    """Projections made by nn.Linear (its own init, at the line that builds them), then redrawn
    through ``weight.data`` by ``self.apply``: the doctor names the redraw, the last write to
    the weights' memory, and, with no other spread the module draws with, proves no fix."""
    code = cli.main(["doctor", f"{fm.__file__}:DrawnThroughData"])
    said = capsys.readouterr().out
    lines = Path(fm.__file__).read_text().splitlines()
    number = next(i for i, t in enumerate(lines, 1) if "weight.data.normal_(" in t)
    assert code == 1 and said.splitlines()[1].startswith("FAIL  init_unit_variance"), said
    assert f"fix_modules.py:{number} " in said.splitlines()[1], said
    assert "no fix proven" in said, said


def test_a_scale_is_put_only_as_a_size_worth_the_head_width(tmp_path, capsys):
    """Scores divided by the root of the model's width, q and k layer-normed so that SDPA's
    comparison cannot measure the scale: any other size in scope (the batch's) would pass
    the probes; only one worth the head width the forward contracts over is tried."""
    out = tmp_path / "fix.diff"
    code = cli.main(["doctor", f"{fm.__file__}:NormedScaledByWidth", "--fix", str(out)])
    said = capsys.readouterr().out
    assert code == 1 and said.splitlines()[1].startswith("FAIL  scale_d_model"), said
    assert "/ math.sqrt(self.head_dim)  # BUG" in out.read_text(), out.read_text()


def test_a_module_that_lays_each_positions_heads_out_as_rows_is_healthy():
    """Multi-query attention's (B, T * h, d) queries keep each position whole: no heads split
    without the transpose."""
    d = diagnose(
        fm.QueriesRowPerHeadRight(64, 4), Config(causal=True, mask="keep", mask_shape="bk")
    )
    assert d.healthy, d.text()


def test_a_float64_copy_that_is_not_finite_where_float32_is_is_probed_in_float32():
    """Mistral's eager mask, float64's ``finfo.min`` turned to -inf by a float32 softmax,
    gives NaN where a padded query's window holds only padding: only in the doctor's float64
    copy, never in a dtype it runs in. The doctor probes it in float32 then, and finds it
    healthy."""
    d = diagnose(
        fm.WindowJoinedToPaddingRight(64, 4),
        Config(causal=True, mask="keep", mask_shape="bk", window=4),
    )
    assert d.healthy, d.text()
    assert "probed in: float32: in float64 an ordinary call is not finite" in d.text()
    plain = diagnose(dm.TutorialMultiHead(64, 4), Config(mask="keep"))
    assert "probed in" not in plain.text(), plain.text()


def test_a_scale_is_fixed_with_the_parameter_nothing_reads_not_the_width_worth_as_much(
    tmp_path, capsys
):
    """Gemma 2's scale slipped from ``query_pre_attn_scalar`` to the head width: at the
    doctor's width (64) ``hidden_size`` is worth the scalar too, and a root of the width is the
    scale_d_model trap; the parameter the slip left unread is the fix."""
    out = tmp_path / "fix.diff"
    code = cli.main(["doctor", f"{fm.__file__}:ScaleOfAnotherSize", "--scale", "0.125",
                     "--init", "query_pre_attn_scalar=64", "--fix", str(out)])  # fmt: skip
    said = capsys.readouterr().out
    assert code == 1 and said.splitlines()[1].startswith("FAIL  wrong_scale"), said
    assert "`scores = q @ k.transpose(-1, -2) * self.scaling  #" in said.splitlines()[1], said
    assert "with this change every probe passes" in said, said
    assert "+        self.scaling = query_pre_attn_scalar**-0.5  # BUG" in out.read_text()


SIZED = """class A:
    def forward(self, query, key):
        d_k = self.d_k
        scores = query @ key.transpose(-2, -1) / {root}
"""


@pytest.mark.parametrize(
    ("root", "fixed"),
    [("math.sqrt(query.size(-1))", "math.sqrt(d_k)"), ("query.shape[-1] ** 0.5", "d_k ** 0.5"),
     ("np.power(query.size(-1), 0.5)", "np.power(d_k, 0.5)")],
)  # fmt: skip
def test_a_scale_taken_of_a_tensors_size_is_put_as_another_size_in_scope(root, fixed):
    """The model's width as a tensor's size: the size is an operand of its own, put as a name
    in scope worth another value when the line runs, whichever way the root is written."""
    values = {"query.size(-1)": 64, "query.shape[-1]": 64, "d_k": 16, "self.d_k": 16}
    line = Line(SIZED.format(root=root), 4, {**F_NAMES, "np": np}, lambda found: values)
    written = next(RECIPES["scale_d_model"](line)).splitlines()[3]
    assert written.strip() == f"scores = query @ key.transpose(-2, -1) / {fixed}"


READ_TWICE = """import math

import torch
from torch import nn


class TwiceMasked(nn.Module):
    def __init__(self, d_model, n_head):
        super().__init__()
        self.h, self.d_k = n_head, d_model // n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, x, mask):  # mask: (B, T, T), True where a query may attend
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3 * self.h, self.d_k).transpose(1, 2).chunk(3, 1)
        blocked = mask.unsqueeze(1).eq({keep})  # (B, 1, T, T)
        scores = (q @ k.transpose(-2, -1) / math.sqrt(self.d_k)).masked_fill(blocked, -1e9)
        weights = torch.softmax(scores, dim=-1).masked_fill(blocked, 0.0)
        return (weights @ v).transpose(1, 2).reshape(B, T, C)
"""


def test_a_mask_read_in_two_places_is_fixed_where_it_is_made(tmp_path):
    """The mask fills the scores and zeroes the weights (ESPnet's way): inverting it at the
    fill fixes one of the two, and is a partial fix; where it is made fixes both, and that
    is the fix shown."""
    path = tmp_path / "twice.py"
    path.write_text(READ_TWICE.format(keep=1))
    target = f"{path}:TwiceMasked"
    config = Config(mask="keep")
    d = diagnose(_built(target), config, target)
    assert d.causes[0].trap == "mask_bool", d.text()
    [fix] = propose(
        d,
        lambda: diagnose(_built(target), config, target),
        lambda seq_len=None, unpadded=False: called_once(
            _built(target), config, seq_len=seq_len, unpadded=unpadded
        ),
    ).fixes
    assert fix.proof == "with this change every probe passes", fix
    assert fix.after[0].strip() == "blocked = mask.unsqueeze(1).eq(0)  # (B, 1, T, T)"


def test_kv_heads_copied_in_blocks_where_strided_is_declared_are_named():
    """x-transformers copies its K/V heads strided (``(r h)``); a copy in blocks, where the
    user declared strided, is gqa_kv_grouping too, not an unnamed failure."""
    config = Config(causal=True, positions="relative", kv_grouping="strided")
    d = diagnose(fm.GroupedRotary(64, 4), config)
    found = {f.probe: f for f in d.findings}
    assert found["grouped heads"].status == FAIL, d.text()
    assert "gqa_kv_grouping" in found["grouped heads"].traps, found["grouped heads"]


ROOTED = """class A:
    def __init__(self):
        self.hidden_size, self.head_dim = 64, 16

    def forward(self, q, k, bsz):
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.hidden_size)
"""


def test_a_scale_root_is_put_only_as_a_size_worth_the_one_the_forward_shows():
    """With the size the root belongs to known (the head width, 16), a root of the width is
    put only as a name worth it: the batch's size (4), which a scale the probes cannot
    measure would let through, is never proposed."""
    worth = {"self.hidden_size": 64, "bsz": 4, "self.head_dim": 16}
    line = Line(ROOTED, 6, F_NAMES, lambda names: {n: worth[n] for n in names if n in worth},
                width=64, root=16.0)  # fmt: skip
    candidates = list(recipes.scale_d_model(line))
    assert candidates and all("math.sqrt(self.head_dim)" in c for c in candidates), candidates
    anyhow = list(recipes.scale_d_model(dataclasses.replace(line, root=None)))
    assert any("math.sqrt(bsz)" in c for c in anyhow), anyhow  # what the root rules out


def test_the_root_a_scale_belongs_to_is_the_head_width_or_the_declared_scale():
    d = Diagnosis("m", Config(), head_width=16)
    assert prove._root("scale_d_model", d) == 16.0
    assert prove._root("wrong_scale", Diagnosis("m", Config(scale=0.125))) == 64.0
    assert prove._root("missing_scale", d) is None
