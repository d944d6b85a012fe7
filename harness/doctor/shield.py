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

import os
import signal
import sys
from collections.abc import Callable, Collection

CRASHED = (
    "crashed the process ({signal}): a fault below Python, in torch's or an extension's native "
    "code, not an exception; the other probes ran in a fresh process"
)

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
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: the command, then out, whatever happens
            os.close(read)
            _steps, status = write, 1
            try:
                status = command()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        os.close(write)
        status = _wait(pid)
        steps = _read(read)
        if not os.WIFSIGNALED(status):
            return os.waitstatus_to_exitcode(status)
        name = signal.Signals(os.WTERMSIG(status)).name
        last = steps[-1] if steps else "starting"
        # a probe of the model doctor's layers is named "path: probe"
        if (last not in probes and last.rpartition(": ")[2] not in probes) or last in _crashed:
            print(
                f"python -m harness doctor: the module crashed the process ({name}) while "
                f"{last}: a fault below Python, in torch's or an extension's native code; "
                "nothing more to diagnose",
                file=sys.stderr,
            )
            return 1
        _crashed[last] = CRASHED.format(signal=name)


def _wait(pid: int) -> int:
    """The child's wait status; Ctrl-C reaches the child too (one process group), so the parent
    waits for it to finish and say so."""
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except KeyboardInterrupt:
            continue


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
