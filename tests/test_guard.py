"""The guard around user code: prints captured, exits and hangs turned into failures, the
process's global settings restored; and the Python API checks its device as the CLI does."""

import _thread
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from harness import cli
from harness.doctor import Config, UserCodeError, diagnose, guarded, shield
from harness.doctor import examine as examine_module
from harness.doctor import guard as guard_module
from harness.doctor.findings import passed
from harness.errors import UsageError
from tests import misbehaving_modules as mm

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def safety_net(monkeypatch):
    """Put every setting back even when a test fails, so no other test inherits a change."""
    monkeypatch.chdir(os.getcwd())
    saved = guard_module.snapshot()
    yield
    guard_module.restore(saved)


def test_prints_are_captured(capsys):
    with guarded() as printed:
        print("to stdout")
        print("to stderr", file=sys.stderr)
    out, err = capsys.readouterr()
    assert out == err == ""
    assert printed.getvalue() == "to stdout\nto stderr\n"


@pytest.mark.parametrize(
    "code, message",
    [(0, "calls sys.exit(0)"), (3, "calls sys.exit(3)"), (None, "calls sys.exit()"),
     ("bye", "calls sys.exit('bye')")],
)  # fmt: skip
def test_sys_exit_becomes_an_ordinary_failure(code, message):
    with pytest.raises(UserCodeError) as caught, guarded():
        sys.exit(code)
    assert str(caught.value) == message


def test_every_setting_is_restored(safety_net):
    before = mm.global_settings()
    with guarded():
        mm.ChangesGlobals(4, when_built=False).misbehave(None)
        changed = mm.global_settings()
    assert [k for k in before if changed[k] == before[k]] == []  # the module changed them all
    assert mm.global_settings() == before


def test_keyboard_interrupt_passes_through_with_settings_restored(safety_net):
    before = mm.global_settings()
    with pytest.raises(KeyboardInterrupt), guarded():
        torch.set_default_dtype(torch.float64)
        raise KeyboardInterrupt
    assert mm.global_settings() == before


def busy(seconds: float) -> None:
    """Loop for ``seconds`` swallowing every Exception, as a forward that never returns might
    (bounded, so a broken time limit fails the test instead of hanging it)."""
    end = time.monotonic() + seconds
    while True:
        try:
            if time.monotonic() > end:
                break
            sum(range(100))
        except Exception:
            pass


def test_a_loop_is_stopped_at_the_time_limit_and_the_alarm_put_back():
    handler = signal.getsignal(signal.SIGALRM)
    start = time.monotonic()
    with pytest.raises(UserCodeError, match=r"did not finish within 0\.3 s"), guarded(0.3):
        busy(10)
    assert time.monotonic() - start < 5
    assert signal.getsignal(signal.SIGALRM) is handler
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@pytest.mark.parametrize("seconds", [None, 0, float("inf"), float("nan")])
def test_no_limit_means_no_timer(seconds):
    with guarded(seconds):
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_someone_elses_pending_timer_is_left_alone():
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
    signal.setitimer(signal.ITIMER_REAL, 100)
    try:
        with guarded(0.2):
            busy(0.5)  # no limit of ours: theirs would have been replaced
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 90 < remaining <= 100 and not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_off_the_main_thread_there_is_no_limit_and_no_error():
    errors = []

    def work():
        try:
            with guarded(0.2):
                busy(0.4)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert errors == []


def test_diagnose_restores_settings_a_forward_changes(safety_net):
    """Autocast and the random stream too: the caller's next test must not compute in float16
    or draw other numbers because a module was diagnosed."""
    module = mm.ChangesGlobals(16, when_built=False)
    before = mm.global_settings()
    diagnosis = diagnose(module, Config(d_model=16))
    assert mm.global_settings() == before
    assert diagnosis.findings  # it ran


def calls_with(seq_len: int):
    """A probe that calls the module once on ``seq_len`` tokens, and passes if it returns."""

    def run(subject):
        out, _ = subject.call(subject.copy(), subject.x(2, seq_len, 0), None)
        return passed(f"output {tuple(out.shape)}")

    return run


@pytest.fixture
def two_probes(monkeypatch):
    """Just two probes, one calling the module on 5 tokens, then one on 3."""
    probes = {"long": calls_with(5), "short": calls_with(3)}
    monkeypatch.setattr(examine_module, "PROBES", probes)


def test_an_exit_in_one_probe_fails_that_probe_only(two_probes):
    diagnosis = diagnose(mm.ExitsOnLongInputs(16), Config(d_model=16))
    assert [(f.probe, f.status, f.message) for f in diagnosis.findings] == [
        ("long", "fail", "calls sys.exit()"),
        ("short", "pass", "output (2, 3, 16)"),
    ]


def test_an_exit_at_the_first_call_stops_with_one_finding():
    diagnosis = diagnose(mm.ExitsInForward(16), Config(d_model=16))
    assert [(f.probe, f.status, f.message) for f in diagnosis.findings] == [
        ("calling the module", "fail", "calls sys.exit(0)")
    ]
    assert diagnosis.exit_code == 1


def test_an_exit_while_detecting_the_mask_convention_fails_that_step():
    diagnosis = diagnose(mm.ExitsWithMask(16), Config(d_model=16))
    assert [(f.probe, f.status, f.message) for f in diagnosis.findings] == [
        ("mask convention", "fail", "calls sys.exit(0)")
    ]


def test_prints_during_diagnosis_are_captured(capsys):
    module = mm.Prints(16)
    assert capsys.readouterr().out == "building Prints\n"  # outside the doctor: printed
    diagnose(module, Config(d_model=16))
    assert capsys.readouterr() == ("", "")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_absent_cuda_via_the_api_is_a_usage_error_before_probing(monkeypatch):
    called = []
    monkeypatch.setattr(mm.Plain, "misbehave", lambda self, x: called.append(1))
    with pytest.raises(UsageError, match="device 'cuda' is not available here"):
        diagnose(mm.Plain(16), Config(d_model=16, device="cuda"))
    assert called == []


def test_an_unknown_device_via_the_api_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown device 'tpu'"):
        diagnose(mm.Plain(16), Config(d_model=16, device="tpu"))


@pytest.mark.parametrize("seed", [-1, 2**32, 2**64, 1.5, True])
def test_a_seed_out_of_range_via_the_api_is_a_usage_error_before_probing(monkeypatch, seed):
    called = []
    monkeypatch.setattr(mm.Plain, "misbehave", lambda self, x: called.append(1))
    with pytest.raises(UsageError, match="a seed is an integer from 0 to 4,294,967,295"):
        diagnose(mm.Plain(16), Config(d_model=16, seed=seed))
    assert called == []


@contextmanager
def watchdog(seconds: float):
    """Interrupt the block after ``seconds``: a broken time limit fails the test, not hangs it."""
    done = threading.Event()

    def bark() -> None:
        if not done.wait(seconds):
            _thread.interrupt_main()

    thread = threading.Thread(target=bark, daemon=True)
    thread.start()
    try:
        yield
    except KeyboardInterrupt:
        pytest.fail(f"still running after {seconds} s: the time limit did not stop it")
    finally:
        done.set()
        thread.join()


def test_a_forward_that_never_returns_fails_in_bounded_time(capsys):
    start = time.monotonic()
    with watchdog(60):
        code = cli.main(["doctor", f"{mm.__file__}:Hangs", "--d-model", "16", "--timeout", "1",
                         "--json"])  # fmt: skip
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert code == 1 and len(findings) == 1 and time.monotonic() - start < 30
    assert findings[0]["message"].startswith("did not finish within 1 s (a forward that never")


def test_the_doctor_moves_on_after_a_probe_runs_out_of_time(two_probes):
    with watchdog(60):
        diagnosis = diagnose(mm.HangsOnLongInputs(16), Config(d_model=16), timeout=1)
    (long, short) = diagnosis.findings
    assert long.status == "fail" and long.message.startswith("did not finish within 1 s")
    assert short.status == "pass"


def random_streams() -> tuple[object, ...]:
    """torch's CPU generator, Python's random and numpy's global one, comparable with ==."""
    import numpy

    _, keys, pos, *_ = numpy.random.get_state()
    return bytes(torch.random.get_rng_state().numpy()), random.getstate(), keys.tobytes(), pos


def test_a_module_that_reseeds_leaves_the_callers_streams_and_hooks_as_they_were():
    """The caller's random streams go on as if the doctor had not run (a pytest session's
    later tests draw the numbers they would have), and a global hook the module registers is
    gone: every step that calls the module is guarded, the first set-up call included."""
    module = mm.Reseeds(16)
    hooks = dict(torch.nn.modules.module._global_forward_hooks)
    torch.manual_seed(7)
    before = random_streams()
    diagnosis = diagnose(module, Config(d_model=16))
    assert diagnosis.findings
    assert random_streams() == before
    assert dict(torch.nn.modules.module._global_forward_hooks) == hooks


def test_a_thread_the_module_leaves_running_does_not_keep_the_command_alive():
    target = "tests/misbehaving_modules.py:StartsThread"
    command = [sys.executable, "-m", "harness", "doctor", target, "--d-model", "16", "--json"]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert time.monotonic() - start < 90  # the thread sleeps 120 s
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout)  # the verdict, whole
    assert "not waiting for 1 thread(s) that user code started" in done.stderr
    assert "'left-running'" in done.stderr


@pytest.mark.skipif(not shield.available(), reason="the shield forks: Linux only")
def test_a_probe_that_crashes_the_process_is_a_failure_and_the_others_still_run():
    target = "tests/misbehaving_modules.py:CrashesUnderAutocast"
    command = [sys.executable, "-m", "harness", "doctor", target, "--d-model", "16", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=200, cwd=ROOT)
    assert done.returncode == 1, done.stderr
    found = {f["probe"]: f for f in json.loads(done.stdout)["findings"]}
    for low in ("float16 robustness", "bfloat16 robustness"):
        assert found[low]["status"] == "fail", found[low]
        assert found[low]["message"].startswith("crashed the process (SIGSEGV)")
    assert found["agrees with SDPA"]["status"] == "pass"
    assert [f for f in found.values() if f["status"] == "fail"] == [
        found["float16 robustness"], found["bfloat16 robustness"]]  # fmt: skip


@pytest.mark.skipif(not shield.available(), reason="the shield forks: Linux only")
def test_a_module_that_crashes_whenever_it_is_called_is_one_line():
    target = "tests/misbehaving_modules.py:CrashesInForward"
    command = [sys.executable, "-m", "harness", "doctor", target, "--d-model", "16"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert done.returncode == 1 and done.stdout == "", done.stdout
    (line,) = done.stderr.strip().splitlines()
    assert line == (
        "python -m harness doctor: the module crashed the process (SIGSEGV) while calling the "
        "module: a fault below Python, in torch's or an extension's native code; nothing more "
        "to diagnose"
    )


@pytest.mark.skipif(not shield.available(), reason="the shield forks: Linux only")
@pytest.mark.parametrize(
    ("module", "said"),
    [
        ("EndsTheProcess", "the module ended the process (os._exit or the like, exit status 0)"),
        ("RaisesABaseException", "stopped by Fatal: \\x1b[31mred\\x1b[0m; no diagnosis"),
    ],
)
def test_a_module_that_leaves_the_command_by_itself_is_one_line_and_exit_1(module, said):
    """An exit of the module's own, or an exception nothing catches, is neither silence nor
    the module's status (os._exit(0) must not pass CI as healthy), and no escape code reaches
    the terminal raw."""
    target = f"tests/misbehaving_modules.py:{module}"
    command = [sys.executable, "-m", "harness", "doctor", target, "--d-model", "16", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert done.returncode == 1, (done.stdout, done.stderr)
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("python -m harness doctor: ") and said in line, line
    assert "\x1b" not in done.stderr


def test_an_exception_whose_message_raises_is_a_finding_like_any_other():
    d = diagnose(mm.RaisesAnUnprintableError(16), Config())
    messages = [f.message for f in d.findings if f.status == "fail"]
    assert any("Unprintable: (its message raised an exception)" in m for m in messages), messages


def running(marker: str) -> list[int]:
    """The processes whose command line holds ``marker``."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes().decode():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


@pytest.mark.skipif(not shield.available(), reason="the shield forks: Linux only")
@pytest.mark.parametrize(
    ("module", "signum", "code"),
    [("Hangs", signal.SIGTERM, 143), ("Hangs", signal.SIGINT, 130),
     ("IgnoresStopSignals", signal.SIGTERM, 143)],
)  # fmt: skip
def test_a_stop_signal_to_the_doctor_alone_stops_its_child_too(tmp_path, module, signum, code):
    """kill, Popen.terminate() and a cancelled CI job signal the doctor's process alone, not its
    process group: the child it forked must stop too (killed, if it ignores the signal), with
    one line and the signal's status."""
    marker = str(tmp_path / "marker")  # an argument only this run's processes carry
    target = f"{ROOT}/tests/misbehaving_modules.py:{module}"
    command = [sys.executable, "-m", "harness", "doctor", target, "--d-model", "16",
               "--timeout", "0", "--report", f"{marker}.md"]  # fmt: skip
    doctor = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(running(marker)) < 2 and time.monotonic() < deadline:  # parent and child
            time.sleep(0.1)
        assert len(running(marker)) == 2
        time.sleep(1)  # in the module's forward by now
        doctor.send_signal(signum)
        _, err = doctor.communicate(timeout=30)
        assert doctor.returncode == code, err
        assert err.strip().splitlines()[-1].startswith("python -m harness: interrupted"), err
        assert running(marker) == []
    finally:  # a failure leaves no process of this test spinning
        for pid in running(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not shield.available(), reason="the shield forks: Linux only")
def test_nothing_the_module_forks_outlives_the_doctor(tmp_path):
    marker = str(tmp_path / "marker")
    target = f"{ROOT}/tests/misbehaving_modules.py:ForksASleeper"
    command = [sys.executable, "-m", "harness", "doctor", target, "--d-model", "16",
               "--report", f"{marker}.md"]  # fmt: skip
    try:  # output to a file: a pipe would wait for every process that holds it
        with open(f"{marker}.out", "w") as out:
            done = subprocess.run(command, cwd=ROOT, stdout=out, stderr=out, timeout=200)
        assert done.returncode in (0, 1), Path(f"{marker}.out").read_text()
        assert running(marker) == []
    finally:
        for pid in running(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
