"""``python -m harness`` and the ``attention-pitfalls`` script: see harness.cli.

Ctrl-C while it starts (importing torch, pandas and matplotlib takes seconds, before
``main`` catches it) gives the same one line and exit status 130 as Ctrl-C later; once ``main``
has returned, its outcome stands and Ctrl-C no longer interrupts the interpreter's last clean-up.
"""

import signal
import sys


def run() -> int:
    """Import the command line and run it; the console script's entry point."""
    try:
        from harness.cli import main

        status = main()
    except KeyboardInterrupt:
        print("python -m harness: interrupted", file=sys.stderr)
        status = 130
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return status


if __name__ == "__main__":
    sys.exit(run())
