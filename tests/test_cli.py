"""The command line, used as a user would: output, formats, and bad input."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness import cli, devices
from harness.catalogue import registry
from harness.doctor import guard
from harness.progress import Progress
from tests import misbehaving_modules


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_has_one_line_per_trap(capsys):
    code, out, _ = run_cli(capsys, "list")
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) == len(registry.ids())
    assert lines[0].split()[0] == registry.ids()[0]
    assert any(line.split() == ["transpose", "§4.3", "layout", "CONDITIONAL"] for line in lines)


def test_show_gives_the_card_then_the_diff(capsys):
    code, out, _ = run_cli(capsys, "show", "mask_bool")
    assert code == 0
    assert out.index("The tutorial says:") < out.index("--- buggy.py") < out.index("# FIX:")


def test_diff_is_plain_when_not_a_terminal(capsys):
    code, out, _ = run_cli(capsys, "diff", "softmax_dim")
    assert code == 0 and "\033[" not in out
    assert out.startswith("--- buggy.py\n+++ fixed.py")
    _, coloured, _ = run_cli(capsys, "diff", "softmax_dim", "--color", "always")
    assert "\033[31m-" in coloured


@pytest.mark.parametrize("fmt", ["md", "csv", "json"])
def test_run_prints_each_format(capsys, fmt):
    code, out, _ = run_cli(capsys, "run", "softmax_dim", "--dtype", "float32", "--format", fmt)
    assert code == 0
    if fmt == "json":
        rows = json.loads(out)
        assert [(r["pitfall"], r["verdict"]) for r in rows] == [("softmax_dim", "SILENT")]
    elif fmt == "csv":
        assert out.splitlines()[0].startswith("pitfall,device,dtype,verdict")
    else:
        assert out.startswith("| pitfall") and "SILENT" in out


BAD_INPUTS = {
    "unknown id": (["run", "mask_boool"], "unknown pitfall 'mask_boool'; known: "),
    "unknown id in show": (["show", "nope"], "unknown pitfall 'nope'"),
    "bad dtype": (["run", "--dtype", "float8"], "invalid choice: 'float8'"),
    "bad device": (["run", "--device", "tpu"], "unknown device 'tpu'"),
    "no command": ([], "required: command"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line_and_exit_2(capsys, case):
    argv, message = BAD_INPUTS[case]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_absent_cuda_is_a_usage_error(capsys, tmp_path):
    out_dir = tmp_path / "out"
    code, _, err = run_cli(capsys, "report", "--device", "cuda", "--out", str(out_dir))
    assert code == 2 and "not available here" in err and err.count("\n") == 1
    assert not out_dir.exists()


def test_dtype_the_device_cannot_run_is_a_usage_error(monkeypatch):
    def broken_bmm(*args, **kwargs):
        raise RuntimeError("\"bmm\" not implemented for 'Half'")

    monkeypatch.setattr(devices.torch, "bmm", broken_bmm)
    with pytest.raises(devices.UsageError, match="dtype float16 does not run on cpu"):
        devices.resolve_dtype("float16", torch.device("cpu"))


def test_unwritable_out_is_a_usage_error(capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, _, err = run_cli(capsys, "report", "--dtype", "float32", "--out", str(blocker / "sub"))
    assert code == 2 and "cannot write to --out" in err and err.count("\n") == 1
    assert blocker.read_text() == "not a folder"


def test_module_entry_point_runs_without_traceback():
    result = subprocess.run(
        [sys.executable, "-m", "harness", "run", "nope"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert result.stderr.startswith("python -m harness: error: unknown pitfall 'nope'")
    assert "Traceback" not in result.stderr


def test_progress_is_silent_off_a_terminal():
    stream = io.StringIO()
    with Progress(3, stream=stream, delay=0.0) as bar:
        for i in range(3):
            bar.step(str(i))
    assert stream.getvalue() == ""


def test_progress_draws_on_a_terminal_after_the_delay():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    with Progress(2, stream=stream, delay=0.0) as bar:
        bar.step("first")
        bar.step("second")
    assert "1/2 second" in stream.getvalue()


# The doctor on modules whose code exits, prints, hangs, interrupts or changes global settings:
# its exit status (0, 1, 2; 130 on Ctrl-C) and its --json stay its own.
MISBEHAVING = Path(misbehaving_modules.__file__).resolve()


def run_doctor(capsys, name, *flags):
    return run_cli(capsys, "doctor", f"{MISBEHAVING}:{name}", "--d-model", "16", *flags)


def test_doctor_json_stays_json_when_the_module_prints(capsys):
    code, out, err = run_doctor(capsys, "Prints", "--json")
    assert json.loads(out)["healthy"] and code == 0 and err == ""


def test_doctor_exit_when_built_is_one_usage_line(capsys):
    code, out, err = run_doctor(capsys, "ExitsInInit")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "stopped: it calls sys.exit(3)" in err


def test_doctor_exit_in_forward_fails_with_the_doctors_own_status(capsys):
    code, out, _ = run_doctor(capsys, "ExitsInForward", "--json")
    findings = json.loads(out)["findings"]
    assert code == 1 and [f["message"] for f in findings] == ["calls sys.exit(0)"]


def test_doctor_ctrl_c_is_exit_130_and_writes_no_report(capsys, tmp_path):
    report = tmp_path / "doctor.md"
    code, out, err = run_doctor(capsys, "Interrupted", "--report", str(report))
    assert code == 130 and out == "" and err.strip() == "python -m harness: interrupted"
    assert not report.exists()


@pytest.fixture
def settings_kept(monkeypatch):
    monkeypatch.chdir(os.getcwd())
    saved = guard.snapshot()  # a safety net: no other test inherits a change if this one fails
    yield
    guard.restore(saved)


def test_doctor_leaves_global_settings_as_they_were(capsys, settings_kept):
    before = misbehaving_modules.global_settings()
    code, out, _ = run_doctor(capsys, "ChangesGlobals", "--json")  # when built and in forward
    assert code in (0, 1) and json.loads(out)["findings"]
    assert misbehaving_modules.global_settings() == before


@pytest.mark.parametrize("value", ["-1", "nan", "soon"])
def test_doctor_bad_timeout_is_a_usage_error(capsys, value):
    code, out, err = run_doctor(capsys, "Plain", "--timeout", value)
    assert code == 2 and out == "" and err.count("\n") == 1 and "--timeout" in err
