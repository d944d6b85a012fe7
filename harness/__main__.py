"""``python -m harness`` and the ``attention-pitfalls`` script: see harness.cli.

Ctrl-C while it starts (importing torch, pandas and matplotlib takes seconds, before
``main`` catches it) gives the same one line and exit status 130 as Ctrl-C later; once ``main``
has returned, its outcome stands and Ctrl-C no longer interrupts the interpreter's last clean-up.
Nor does a thread that someone else's code started and left running (a module under the doctor
that starts one): the harness starts none, so the command says so on stderr and exits without
waiting for it, where Python would wait for it forever.
"""

import os
import signal
import sys
import threading

INTERRUPTED = "python -m harness: interrupted"


def run() -> int:
    """Import the command line and run it; the console script's entry point. The doctor's
    command runs in a child process where it can (``harness.doctor.shield``): a crash in native
    code there ends a probe, not the command."""
    if sys.argv[1:2] == ["doctor"]:
        try:
            from harness.doctor import shield
            from harness.doctor.model.examine import MODEL_PROBES
            from harness.doctor.probes import PROBES
        except KeyboardInterrupt:
            print(INTERRUPTED, file=sys.stderr)
            return 130
        if shield.available():  # the child ends with os._exit: no thread of the user's waits
            return shield.run(command, [*PROBES, *MODEL_PROBES])
    status = command()
    if left_running():  # said by command(); Python would wait for them forever
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def command() -> int:
    """The command line's exit status; Ctrl-C is one line and 130."""
    try:
        from harness.cli import main

        status = main()
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        status = 130
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    left = left_running()
    if left:
        names = ", ".join(repr(t.name) for t in left)
        print(
            f"python -m harness: not waiting for {len(left)} thread(s) that user code started "
            f"and left running ({names})",
            file=sys.stderr,
        )
    return status


def left_running() -> list[threading.Thread]:
    """The non-daemon threads still running besides the main one: Python would wait for them
    at exit."""
    main = threading.main_thread()
    return [t for t in threading.enumerate() if t is not main and not t.daemon and t.is_alive()]


if __name__ == "__main__":
    sys.exit(run())
