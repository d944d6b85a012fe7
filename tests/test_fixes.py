"""The doctor's fixes: a named trap's line rewritten into the user's own code, shown only once
the rewritten code, diagnosed again, passes; the user's file never touched."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from harness import cli
from harness.doctor import Config, diagnose
from harness.doctor.examine import called_once
from harness.doctor.findings import FAIL, PASS, Finding
from harness.doctor.fixes import propose, recipes
from harness.doctor.fixes.line import Line
from harness.doctor.fixes.live import owners
from harness.doctor.fixes.recipes import mask_bool, softmax_dim
from harness.doctor.target import Sizes, load_object
from harness.doctor.target import build as build_target
from tests import doctor_modules as dm
from tests.helpers import TUTORIAL_EDITS

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
        lambda seq_len=None: called_once(_built(target), CONFIG, seq_len=seq_len),
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
        lambda seq_len=None: called_once(module, config, seq_len=seq_len),
        lambda: called_once(module, bare),
    ).fixes


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
