"""The command line, used as a user would: output, formats, and bad input."""

import argparse
import contextlib
import inspect
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import harness
from harness import cli, devices, interrupts
from harness.catalogue import registry
from harness.cli import catalogue as catalogue_commands
from harness.cli import doctor as doctor_commands
from harness.doctor import guard
from harness.doctor.target import load_object
from harness.errors import UsageError
from harness.files import CLAIMS_PAGE, ensure_writable
from harness.progress import Progress
from tests import misbehaving_modules

ROOT = Path(__file__).resolve().parents[1]


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_has_a_header_then_one_line_per_trap(capsys):
    code, out, _ = run_cli(capsys, "list")
    header, *lines = out.rstrip("\n").splitlines()
    assert code == 0 and len(lines) == len(registry.ids())
    assert header.split() == ["id", "§", "category", "expected"]
    assert lines[0].split()[0] == registry.ids()[0]
    assert any(line.split() == ["transpose", "§3.2", "layout", "CONDITIONAL"] for line in lines)
    for column in ("§", "category", "expected"):  # every row starts each column where it does
        start = header.index(column)
        assert all(line[start - 2 : start] == "  " and line[start] != " " for line in lines)


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
    argv = ["run", "softmax_dim", "--device", "cpu", "--dtype", "float32", "--format", fmt]
    code, out, _ = run_cli(capsys, *argv)  # one device: on a GPU machine too
    assert code == 0
    if fmt == "json":
        rows = json.loads(out)
        assert [(r["pitfall"], r["verdict"]) for r in rows] == [("softmax_dim", "SILENT")]
    elif fmt == "csv":
        assert out.splitlines()[0].startswith("pitfall,device,dtype,verdict")
    else:
        assert out.startswith("| pitfall") and "SILENT" in out


BAD_INPUTS = {
    "unknown id": (["run", "mask_boool"], "unknown pitfall 'mask_boool'; did you mean "),
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


def test_doctor_ctrl_c_is_exit_130_and_writes_no_report(capsys, tmp_path, not_ignored):
    not_ignored(signal.SIGINT)
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


# What users expect of a command line: --version, "did you mean", input echoed short, devices
# named once, NO_COLOR, and Ctrl-C (or SIGTERM, SIGHUP) as one line.
PROG = "python -m harness"


def one_error_line(capsys, *argv):
    """The one stderr line of a command that must fail with a usage error, prefix removed."""
    code, out, err = run_cli(capsys, *argv)
    assert (code, out) == (2, ""), err
    assert err.count("\n") == 1 and err.startswith(f"{PROG}: error: "), err
    return err[len(f"{PROG}: error: ") : -1]


def test_version_prints_the_package_version(capsys):
    code, out, err = run_cli(capsys, "--version")
    assert (code, out, err) == (0, f"attention-pitfalls {harness.__version__}\n", "")


def test_version_from_the_command_line():
    result = subprocess.run(
        [sys.executable, "-m", "harness", "--version"], capture_output=True, text=True
    )
    assert (result.returncode, result.stdout, result.stderr) == (
        0,
        f"attention-pitfalls {harness.__version__}\n",
        "",
    )


def test_every_command_the_parser_knows_is_dispatched_to_a_function():
    parser = cli.build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(commands.choices) == set(cli.COMMANDS)
    assert all(callable(cli.command(name)) for name in cli.COMMANDS)


def test_parsing_imports_no_torch():
    """Understood, or refused in one line, before torch is imported: bad input costs
    milliseconds, and so does a report with nothing to do (``tests/test_report_receipt.py``)."""
    script = (
        "import sys\n"
        "from harness.cli import main\n"
        "code = main(['run', '--dtype', 'float8'])\n"
        "print('torch' in sys.modules, code)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.stdout == "False 2\n" and "invalid choice: 'float8'" in result.stderr


LONG = "a" * 100_000
SHORT_LONG = f"'{'a' * 60}'… (100000 characters)"  # what an error message echoes of LONG
EXACT_ERRORS = {
    "close id": (
        ["run", "mask_boll"],
        f"unknown pitfall 'mask_boll'; did you mean 'mask_bool'? ({PROG} list shows all)",
    ),
    "close id in show": (
        ["show", "transpos"],
        f"unknown pitfall 'transpos'; did you mean 'transpose'? ({PROG} list shows all)",
    ),
    "no close id": (["diff", "zzz"], f"unknown pitfall 'zzz' ({PROG} list shows all)"),
    "long id": (["run", LONG], f"unknown pitfall {SHORT_LONG} ({PROG} list shows all)"),
    "long device": (
        ["run", "--device", LONG],
        f"unknown device {SHORT_LONG}; use one of: cpu, cuda",
    ),
    "long dtype": (
        ["run", "--dtype", LONG],
        f"argument --dtype: invalid choice: {SHORT_LONG} (choose from 'float32', 'bfloat16', "
        "'float16')",
    ),
    "long extra argument": (
        ["list", LONG],
        f"unrecognized arguments: {'a' * 60}… (100000 characters)",
    ),
    "retired flag": (
        ["doctor", "x.py:X", "--float16"],
        "unrecognized arguments: --float16 (--float16 is gone: say --dtype float16)",
    ),
    "cpu has one index": (
        ["run", "--device", "cpu:1"],
        "device 'cpu:1' does not exist: the CPU is one device, cpu",
    ),
    "misspelt device": (["run", "--device", "cdua"], "unknown device 'cdua'; did you mean 'cuda'?"),
    "upper-case device": (["run", "--device", "CPU"], "unknown device 'CPU'; did you mean 'cpu'?"),
    "gpu": (["doctor", "x.py:X", "--device", "gpu"], "unknown device 'gpu'; did you mean 'cuda'?"),
    "bad device index": (
        ["run", "--device", "cuda:x"],
        "unknown device 'cuda:x'; use cpu, cuda or cuda:N (N: a GPU number)",
    ),
    "device with a newline": (
        ["run", "--device", "cpu\nx"],
        "unknown device 'cpu\\nx'; did you mean 'cpu'?",
    ),
    "model on a layer": (
        ["doctor", "torch.nn:Linear", "--model"],
        "Linear is no model of token ids (no nn.Embedding, no vocabulary size in its config): "
        "leave out --model to diagnose it as one attention module",
    ),
    "zoo with a -k pytest cannot read": (
        ["zoo", "transformers", "-k", "a and ("],
        "-k 'a and (' is no pytest -k expression: expected not OR left parenthesis OR "
        "identifier; got end of input",
    ),
    "compare without a report": (
        ["compare", "reports", "no/such/folder"],
        "no report in no/such/folder: report.md is missing",
    ),
}


@pytest.mark.parametrize("case", EXACT_ERRORS)
def test_usage_error_is_one_exact_line(capsys, case):
    argv, message = EXACT_ERRORS[case]
    assert one_error_line(capsys, *argv) == message


def test_the_file_systems_root_is_no_report_folder():
    """Checked on the folder alone: were the check gone, the command would write a whole
    report into / (a mutant once did)."""
    with pytest.raises(UsageError) as refused:
        ensure_writable(Path("/"))
    assert str(refused.value) == "--out '/' is the file system's root: name a folder of its own"
    with pytest.raises(UsageError):
        ensure_writable(Path("/tmp/.."))


def test_a_modules_escape_codes_do_not_reach_the_terminal_raw(capsys):
    code, out, _ = run_doctor(capsys, "RaisesInColour")
    assert code == 1 and "\x1b" not in out
    assert "\\x1b[2J\\x1b[31mscreen cleared" in out


def test_an_error_building_the_module_is_escaped(capsys):
    code, out, err = run_doctor(capsys, "RaisesInColourWhenBuilt")
    assert code == 2 and out == "" and "\x1b" not in err
    assert "\\x1b[2J\\x1b[31mscreen cleared" in err


class ClosedReader(io.StringIO):
    """A stdout whose reader has gone: every write is a broken pipe."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_reader_keeps_the_commands_status(monkeypatch):
    """`doctor ... | head -0`: the reader is gone, the diagnosis failed all the same."""
    monkeypatch.setattr(sys, "stdout", ClosedReader())
    code = cli.main(["doctor", f"{MISBEHAVING}:RaisesInColour", "--d-model", "16"])
    assert code == 1


def test_a_target_file_need_not_end_in_py(capsys, tmp_path):
    source = tmp_path / "attention.txt"
    source.write_text(MISBEHAVING.read_text())
    code, out, err = run_cli(capsys, "doctor", f"{source}:Plain", "--d-model", "16", "--json")
    assert code == 0 and json.loads(out)["healthy"], err


def test_compare_agrees_with_itself_and_names_what_moved(capsys, tmp_path):
    """Two report folders by the committed report's rule: exit 0 agree, 1 disagree."""
    committed = ROOT / "reports"
    assert cli.main(["compare", str(committed), str(committed / "report.md")]) == 0
    assert "agree" in capsys.readouterr().out
    moved = tmp_path / "moved"
    shutil.copytree(committed, moved, ignore=shutil.ignore_patterns("img"))
    summary = moved / CLAIMS_PAGE  # the page with the summary table
    text = summary.read_text().replace("| SILENT      | SILENT ", "| LOUD        | SILENT ", 1)
    assert text != summary.read_text()
    summary.write_text(text)
    assert cli.main(["compare", str(committed), str(moved)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{committed} and {moved} disagree:") and "LOUD" in out


@pytest.mark.parametrize(
    "target",
    [
        "x" * 300 + ":Attention",  # a package.module name no file system takes
        "x" * 300 + ".py:Attention",  # a file name too long: OSError from Path.is_file
        "sub/" + "x" * 300 + ".py:Attention",
        "x" * 300,  # no ":name"
    ],
)
def test_a_long_doctor_target_is_one_short_line(capsys, target):
    message = one_error_line(capsys, "doctor", target)
    assert "x" * 61 not in message and "(30" in message and len(message) < 250


def test_a_long_target_name_in_a_file_that_exists_is_one_short_line(capsys):
    message = one_error_line(capsys, "doctor", f"{MISBEHAVING}:{'X' * 300}")
    assert message.endswith(f"has no attribute '{'X' * 60}'… (300 characters)")


def test_one_device_is_measured_once_whatever_its_name():
    grid = catalogue_commands.resolve_grid(
        argparse.Namespace(device=["cpu", "cpu:0", "cpu"], dtype=["float32"])
    )
    assert grid == [(torch.device("cpu"), torch.float32)]


def test_cuda_and_cuda_0_are_one_device(monkeypatch):
    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(devices.torch.cuda, "device_count", lambda: 2)
    assert (
        devices.resolve_device("cuda") == devices.resolve_device("cuda:0") == torch.device("cuda")
    )
    assert devices.resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(devices.UsageError, match=r"^device 'cuda:2' does not exist: 2 CUDA"):
        devices.resolve_device("cuda:2")


def test_run_measures_cpu_and_cpu_0_once(capsys):
    argv = ["run", "transpose", "--device", "cpu", "--device", "cpu:0", "--dtype", "float32"]
    code, out, _ = run_cli(capsys, *argv, "--format", "json")
    assert code == 0 and [(r["pitfall"], r["device"]) for r in json.loads(out)] == [
        ("transpose", "cpu")
    ]


@pytest.mark.parametrize(
    ("no_color", "flag", "coloured"),
    [
        (None, "auto", True),
        ("1", "auto", False),
        ("", "auto", True),  # set but empty: no-color.org says it does not count
        ("1", "always", True),
        (None, "never", False),
    ],
)
def test_diff_colour_honours_no_color(capsys, monkeypatch, no_color, flag, coloured):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)  # captured, as if a terminal
    monkeypatch.delenv("NO_COLOR", raising=False)
    if no_color is not None:
        monkeypatch.setenv("NO_COLOR", no_color)
    code, out, _ = run_cli(capsys, "diff", "softmax_dim", "--color", flag)
    assert code == 0 and ("\033[" in out) == coloured


@pytest.fixture
def command(monkeypatch):
    """``list`` replaced by the function given: a command that does what a test needs."""

    def install(function):
        monkeypatch.setattr(catalogue_commands, "cmd_list", function)

    return install


def kill_self(signum):
    """Send ``signum`` to this process, once main has a handler for it (never the default one,
    which would end the test run)."""
    handler = signal.getsignal(signum)
    assert handler not in (signal.SIG_DFL, signal.SIG_IGN, None), "main installed no handler"
    signal.raise_signal(signum)  # to this thread: its handler runs before the next line
    time.sleep(5)  # the handler raises long before
    raise AssertionError(f"signal {signum} did not interrupt")


@pytest.mark.parametrize(
    ("signum", "status", "line"),
    [
        (signal.SIGINT, 130, f"{PROG}: interrupted\n"),
        (signal.SIGTERM, 143, f"{PROG}: interrupted (SIGTERM)\n"),
        (signal.SIGHUP, 129, f"{PROG}: interrupted (SIGHUP)\n"),
    ],
)
def test_a_signal_unwinds_the_command_like_ctrl_c(
    capsys, command, not_ignored, signum, status, line
):
    not_ignored(signum)
    cleaned = []

    def stopped(args):
        try:
            kill_self(signum)
        finally:
            cleaned.append(True)

    command(stopped)
    before = signal.getsignal(signum)
    code, out, err = run_cli(capsys, "list")
    assert (code, out, err) == (status, "", line)
    assert cleaned == [True]
    assert signal.getsignal(signum) is before  # main put the handler back


def test_an_interrupt_swallowed_on_the_way_still_stops_the_command(capsys, command, not_ignored):
    not_ignored(signal.SIGINT)

    def swallows(args):  # as a weakref callback does during matplotlib's drawing
        with contextlib.suppress(BaseException):
            kill_self(signal.SIGINT)
        return "finished as if nothing happened"

    command(swallows)
    assert run_cli(capsys, "list") == (130, "", f"{PROG}: interrupted\n")


def test_a_signal_one_block_received_does_not_stop_what_runs_after_it(not_ignored):
    not_ignored(signal.SIGINT)
    step = interrupts.uninterrupted("a step")
    with interrupts.stop_signals(), pytest.raises(KeyboardInterrupt), step:
        signal.raise_signal(signal.SIGINT)  # held, then raised as the step ends
    with interrupts.uninterrupted("a report written from Python, after the block"):
        pass  # checks the signals received: none since the block ended


def loading_torch(pid: int) -> bool:
    """Whether process ``pid`` has torch's native library mapped: it is importing torch."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads /proc: Linux only")
def test_ctrl_c_while_starting_is_one_line():
    """Ctrl-C while ``python -m harness`` imports torch, before main runs."""
    process = subprocess.Popen(
        [sys.executable, "-m", "harness", "list"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # not ignored
    )
    deadline = time.monotonic() + 60
    while not loading_torch(process.pid) and time.monotonic() < deadline:
        time.sleep(0.005)  # a fixed wait lands before the interpreter has started, when slow
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert (process.returncode, out, err) == (130, "", f"{PROG}: interrupted\n")


@pytest.mark.parametrize("value", [str(2**63), str(2**64), "-1", "1e3"])
def test_doctor_seed_out_of_range_is_one_line_before_anything_runs(capsys, value):
    message = one_error_line(capsys, "doctor", f"{MISBEHAVING}:Plain", "--seed", value)
    assert message.startswith("argument --seed: "), message
    assert "a seed is an integer from 0 to 4,294,967,295" in message or "not an integer" in message


def test_an_adapter_whose_import_hangs_is_stopped_at_the_timeout(capsys, tmp_path):
    adapter = tmp_path / "slow_adapter.py"
    adapter.write_text("import time\ntime.sleep(30)\n\ndef call(module, x, **kw):\n    pass\n")
    start = time.monotonic()
    message = one_error_line(
        capsys, "doctor", f"{MISBEHAVING}:Plain", "--call", f"{adapter}:call", "--timeout", "1"
    )
    assert time.monotonic() - start < 10
    assert "did not finish within 1 s" in message, message


def test_an_interruption_after_a_step_that_changed_files_says_what_changed(
    capsys, command, not_ignored
):
    not_ignored(signal.SIGINT)

    def publishes(args):
        with interrupts.uninterrupted("out/report.md is the new report"):
            signal.raise_signal(signal.SIGINT)  # held: the step finishes first
        raise AssertionError("the held signal was not raised when the step ended")

    command(publishes)
    assert run_cli(capsys, "list") == (
        130,
        "",
        f"{PROG}: interrupted, after it had finished: out/report.md is the new report\n",
    )


@pytest.mark.parametrize("size", [["--seq-len", "100000000"], ["--batch", "10000000"]])
def test_a_size_too_large_to_probe_is_one_line_not_a_failure_of_the_module(capsys, size):
    message = one_error_line(capsys, "doctor", f"{MISBEHAVING}:Plain", *size)
    assert "more than the doctor probes (67,108,864: --seq-len 4096 with --batch 4)" in message


MODEL_FILE = '''\
import torch.nn.functional as F
from torch import nn


class KVCache:
    """Keys and values so far, grown by update."""

    def __init__(self):
        self.k = self.v = None

    def update(self, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], 1)
        self.v = v if self.v is None else torch.cat([self.v, v], 1)
        return self.k, self.v

    def __len__(self):
        return 0 if self.k is None else self.k.shape[1]


class Attention(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)

    def forward(self, x, cache=None):
        assert cache is None or isinstance(cache, KVCache), "a cache of its own file's class"
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # (B, T, d): one head
        if cache is not None:
            k, v = cache.update(k, v)  # (B, S, d): every key so far
        T, S = q.shape[1], k.shape[1]
        keep = torch.ones(T, S, dtype=torch.bool).tril(S - T)  # causal, the new tokens last
        return self.out(F.scaled_dot_product_attention(q, k, v, attn_mask=keep))


import torch  # noqa: E402
'''
ADAPTER_FILE = """\
from {module} import KVCache


def call(module, x, *, positions, mask, cache):
    return module(x, cache=cache)


def make_cache():
    return KVCache()
"""


def test_an_adapter_file_named_like_the_target_file_is_its_own_module(tmp_path):
    (tmp_path / "target").mkdir()
    (tmp_path / "adapter").mkdir()
    target, adapter = tmp_path / "target" / "model.py", tmp_path / "adapter" / "model.py"
    target.write_text(MODEL_FILE)
    (tmp_path / "adapter" / "real.py").write_text(MODEL_FILE)
    adapter.write_text(ADAPTER_FILE.format(module="real"))
    cls = load_object(f"{target}:Attention")
    call = load_object(f"{adapter}:call")
    # each finds its own file by its module name: the class's code, cache and rotary classes
    assert sys.modules[cls.__module__].__file__ == str(target)
    assert sys.modules[call.__module__].__file__ == str(adapter)
    assert "def forward(self, x, cache=None)" in inspect.getsource(cls)


def test_a_target_and_its_adapter_in_one_file_share_the_files_classes(capsys, tmp_path):
    model = tmp_path / "model.py"
    model.write_text(MODEL_FILE + "\n\n" + ADAPTER_FILE.split("\n", 1)[1])
    cls, make_cache = load_object(f"{model}:Attention"), load_object(f"{model}:make_cache")
    assert type(make_cache()) is cls.forward.__globals__["KVCache"]  # one module, not two
    code, out, _ = run_cli(
        capsys, "doctor", f"{model}:Attention", "--causal", "--call", f"{model}:call"
    )
    assert code == 0 and "a cache of its own file's class" not in out, out
    model.write_text(MODEL_FILE.replace("class Attention", "class Renamed"))
    os.utime(model, ns=(1, 1))  # a changed file is loaded again
    assert load_object(f"{model}:Renamed").__name__ == "Renamed"


def test_an_adapter_for_multihead_attention_gets_the_module_itself(capsys, tmp_path):
    adapter = tmp_path / "encoder_call.py"
    adapter.write_text(
        "from torch import nn\n\n\ndef call(module, x, *, positions, mask, cache):\n"
        "    assert type(module) is nn.MultiheadAttention, type(module)\n"
        "    return module(x, x, x, key_padding_mask=mask, need_weights=False)[0]\n"
    )
    code, out, _ = run_cli(
        capsys, "doctor", "torch.nn:MultiheadAttention", "--init", "batch_first=True",
        "--mask", "drop", "--mask-shape", "bk", "--call", f"{adapter}:call",
    )  # fmt: skip
    assert code == 0 and "AssertionError" not in out, out


def test_make_cache_comes_from_the_file_call_names_not_where_call_is_defined(tmp_path):
    (tmp_path / "model_file.py").write_text(
        "def call(module, x, *, positions, mask, cache):\n    return module(x)\n\n\n"
        "def make_cache():\n    return 'the model file'\n"
    )
    adapter = tmp_path / "my_adapter.py"
    adapter.write_text(
        f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
        "from model_file import call  # noqa: E402\n\n\n"
        "def make_cache():\n    return 'the adapter file'\n"
    )
    loaded = doctor_commands.load_adapter(f"{adapter}:call")
    assert loaded.make_cache() == "the adapter file"
    own = doctor_commands.load_adapter(
        "harness.doctor.adapters:x_transformers"
    )  # its own make_cache stands
    assert own.make_cache.__name__ == "XCache"


def test_the_doctor_runs_on_every_core_and_gives_the_thread_count_back(capsys, monkeypatch):
    seen = []
    real = doctor_commands.diagnose

    def counting(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(doctor_commands, "diagnose", counting)
    monkeypatch.setattr(
        doctor_commands.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False
    )
    code, _, _ = run_doctor(capsys, "Plain")
    assert code == 0 and seen == [3]
    assert torch.get_num_threads() == 1  # what main set for every other command
