"""A process around the doctor's command: a crash below Python ends a child, not the diagnosis.

Some faults are not exceptions: a segmentation fault inside torch's native code (torch 2.13's
GroupNorm backward on a transposed input is one) or in a compiled extension kills the process,
and ``guarded()`` cannot catch what never reaches Python. So the command runs in a forked child
that tells the parent each step as it starts. When the child dies of a signal during a probe,
the parent runs the command again in a fresh child in which that probe is a failure ("crashed
the process (SIGSEGV)") and is not run; a crash outside the probes (building the module,
finding its mask) is one line and exit status 1.

The fork happens before anything of the user's runs and before torch has run a parallel region
(OpenMP's threads do not survive a fork), so it is taken only at the command's start
(``harness.__main__``), on Linux; elsewhere, and from Python or pytest, the diagnosis runs in
the process itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Collection

from harness.errors import Interrupted, shorten
from harness.interrupts import STOP_SIGNALS
from harness.runner import describe

PROG = "python -m harness doctor"
DONE = "\0done "  # the child's last word to the parent: its command returned this status
CRASHED = (
    "crashed the process ({signal}): a fault below Python, in torch's or an extension's native "
    "code, not an exception; the other probes ran in a fresh process"
)

GRACE = 0.5  # seconds a stop signal to the parent leaves the child to stop by itself
KILL_AFTER = 5.0  # seconds more a child that ignores the signal passed on is given
_steps: int | None = None  # in a child: the pipe each step's name goes to
_crashed: dict[str, str] = {}  # in a child: the probes that crashed an earlier child


def available() -> bool:
    """A child process can be forked here (Linux)."""
    return sys.platform.startswith("linux") and hasattr(os, "fork")


def note(step: str) -> None:
    """Tell the parent that ``step`` starts (nothing outside a shielded child)."""
    if _steps is not None:
        os.write(_steps, step.encode() + b"\n")


def crashed() -> dict[str, str]:
    """The probes that crashed an earlier child, each with its finding's evidence."""
    return dict(_crashed)


def run(command: Callable[[], int], probes: Collection[str]) -> int:
    """``command``'s exit status, run in a forked child, again without each probe (of
    ``probes``) during which a child dies of a signal."""
    global _steps
    while True:
        read, write = os.pipe()
        flush()
        pid = os.fork()
        if pid == 0:  # the child: the command, then out, whatever happens
            os.close(read)
            os.setpgid(0, 0)  # a group of its own: what the module starts, the parent ends
            _steps = write
            os._exit(_child(command))
        os.close(write)
        status, stopped = _wait(pid)
        steps = _read(read)
        if stopped is not None and not os.WIFEXITED(status):  # ended by force, on our signal
            stop = Interrupted(stopped)
            print(stop.line("python -m harness"), file=sys.stderr)  # as the command says it
            return stop.exit_status
        done = [line for line in steps if line.startswith(DONE)]
        steps = [line for line in steps if not line.startswith(DONE)]
        last = steps[-1] if steps else "starting"
        if done:  # the command returned: its status is the diagnosis's
            return int(done[-1].removeprefix(DONE))
        if not os.WIFSIGNALED(status):  # the user's code ended the process itself
            code = os.waitstatus_to_exitcode(status)
            print(
                f"{PROG}: the module ended the process (os._exit or the like, exit status "
                f"{code}) while {shorten(last)}: no diagnosis; exit status 1",
                file=sys.stderr,
            )
            return 1
        name = signal.Signals(os.WTERMSIG(status)).name
        # a probe of the model doctor's layers is named "path: probe"
        if (last not in probes and last.rpartition(": ")[2] not in probes) or last in _crashed:
            print(
                f"{PROG}: the module crashed the process ({name}) while {shorten(last)}: a "
                "fault below Python, in torch's or an extension's native code; nothing more to "
                "diagnose",
                file=sys.stderr,
            )
            return 1
        _crashed[last] = CRASHED.format(signal=name)


def _child(command: Callable[[], int]) -> int:
    """In the child: the command's exit status, told to the parent last. Whatever escapes it
    (a ``BaseException`` of the user's, an exception whose message itself raises) is one line
    and status 1, not a silent exit."""
    status = 1
    try:
        status = command()
    except BaseException as exc:  # the child must end in one line, whatever it is
        print(f"{PROG}: stopped by {escaped(exc)}; no diagnosis", file=sys.stderr)
    finally:
        try:
            flush()
        finally:
            note(f"{DONE}{status}")
    return status


def flush() -> None:
    """Flush stdout and stderr, as far as they are there (a closed stdout is None) and open."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            if stream is not None:
                stream.flush()


def escaped(exc: BaseException) -> str:
    """``TypeName: message`` on one line, control characters escaped, even when the message
    cannot be made."""
    return shorten(describe(exc), 200)


def _wait(pid: int) -> tuple[int, int | None]:
    """The child's wait status, and the stop signal the parent received, if any.

    A stop signal the parent receives (SIGINT, SIGTERM, SIGHUP: a terminal's Ctrl-C, ``kill``,
    ``Popen.terminate()``, a CI job cancelled) is passed on to the child's process group after
    ``GRACE`` seconds unless the child has ended by then, and the parent waits for the child to
    say so; a child that ignores it is killed ``KILL_AFTER`` seconds later. Once the child has
    ended, whatever the module started in its group is killed too: nothing of the diagnosis
    outlives the command."""
    lock, ended, timers, received = threading.Lock(), [False], [], []

    def pass_on(signum: int) -> None:
        with lock:
            if not ended[0]:
                os.killpg(pid, signum)

    def on_signal(signum: int, frame: object) -> None:
        received.append(signum)
        for delay, sent in ((GRACE, signum), (GRACE + KILL_AFTER, signal.SIGKILL)):
            timer = threading.Timer(delay, pass_on, (sent,))
            timer.daemon = True
            timer.start()
            timers.append(timer)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {signum: signal.signal(signum, on_signal) for signum in STOP_SIGNALS}
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # ended, not yet reaped: still ours
        with lock:
            ended[0] = True
            with contextlib.suppress(OSError):  # its group: what the module left running
                os.killpg(pid, signal.SIGKILL)
        return os.waitpid(pid, 0)[1], (received[0] if received else None)
    finally:
        for timer in timers:
            timer.cancel()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _read(fd: int) -> list[str]:
    """The step names the child wrote (all of them: it has exited, and a process it started
    that still holds the pipe does not keep the parent waiting)."""
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, 65536):
            data += chunk
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    return data.decode(errors="replace").splitlines()
