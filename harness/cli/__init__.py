"""The command line: list, show, diff, run, learn and report the catalogue; doctor your own
module.

This package parses (``parser``) and dispatches: each command lives in the module that
``COMMANDS`` names, imported when it is asked for, so that parsing costs milliseconds and a
report with nothing to do is answered before torch is imported (``report``).

Bad input (an unknown id, an absent device, a dtype the device cannot run) is reported as one
line on stderr with exit status 2, before any work is done and without writing anything.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Callable, Sequence

from harness.cli import report
from harness.cli.parser import PROG, build_parser
from harness.errors import Interrupted, UsageError, printable
from harness.interrupts import stop_signals

__all__ = ["COMMANDS", "PROG", "build_parser", "main"]

# Each command: the module of this package that runs it, and its function there.
COMMANDS = {
    "list": ("catalogue", "cmd_list"),
    "show": ("catalogue", "cmd_show"),
    "diff": ("catalogue", "cmd_diff"),
    "run": ("catalogue", "cmd_run"),
    "learn": ("catalogue", "cmd_learn"),
    "report": ("report", "cmd_report"),
    "compare": ("report", "cmd_compare"),
    "doctor": ("doctor", "cmd_doctor"),
    "zoo": ("doctor", "cmd_zoo"),
}

Outcome = str | tuple[str, int]  # what a command prints, and its exit status (0 unless given)


def command(name: str) -> Callable[[argparse.Namespace], Outcome]:
    """The function that runs the command ``name``, its module imported now."""
    module, function = COMMANDS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), function)


def run(args: argparse.Namespace) -> Outcome:
    """Run the command ``args`` names on one torch thread: its tensors are tiny (one thread is
    faster), and its numbers never depend on the core count."""
    import torch

    torch.set_num_threads(1)
    return command(args.command)(args)


def interrupted(signum: int, done: Sequence[str] = ()) -> int:
    """Say so in one line, with what the command had already changed for good (nothing, unless
    ``done`` says); the exit status a shell gives a process stopped by ``signum``."""
    stop = Interrupted(signum)
    after = f", after it had finished: {'; '.join(done)}" if done else ""
    print(f"{stop.line(PROG)}{after}", file=sys.stderr)
    return stop.exit_status


def main(argv: Sequence[str] | None = None) -> int:
    code = 0  # the command's status, once it has one: a reader gone does not change it
    with stop_signals() as signals:
        try:
            try:
                args = build_parser().parse_args(argv)
            except SystemExit as exc:  # --version, --help: printed, and argparse exits 0
                return exc.code if isinstance(exc.code, int) else 0
            args.argv = list(sys.argv[1:] if argv is None else argv)  # what was given
            current = report.unchanged(args) if args.command == "report" else None
            result = current if current is not None else run(args)
            text, code = result if isinstance(result, tuple) else (result, 0)
            signals.check()  # interrupted, but its exception was swallowed on the way
            print(text)
            return code
        except UsageError as exc:
            signals.quiet = True
            if signals.received:
                return interrupted(signals.received[0], signals.done)
            print(f"{PROG}: error: {printable(str(exc))}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as exc:
            signals.quiet = True
            received = signals.received
            signum = received[0] if received else getattr(exc, "signum", signal.SIGINT)
            return interrupted(signum, signals.done)
        except BrokenPipeError:  # piped into head: not an error of ours, and no other status
            signals.quiet = True
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's final flush quiet
            return code
