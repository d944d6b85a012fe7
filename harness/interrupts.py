"""The signals that stop a command, and the steps they must not cut in half.

In ``stop_signals()``, SIGINT, SIGTERM and SIGHUP raise ``Interrupted`` where the program is, so
a command unwinds as Ctrl-C makes it (its ``finally:`` blocks run). A step that cannot be undone
halfway (publishing a report: pictures in, ``report.md`` replaced, the old pictures removed) runs
in ``uninterrupted(done)``: a signal received inside it is held until the step ends, and then
stops the command, which says what the step had done (``done``) instead of claiming that nothing
changed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from harness.errors import Interrupted

# The signals that stop a command: each unwinds it as Ctrl-C does.
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


class Signals:
    """What ``stop_signals`` received, in order, and what the command had finished for good.

    ``quiet``: record, raise no more (the command is already stopping). ``held``: how many
    ``uninterrupted`` steps are running; a signal then is recorded and raised when they end.
    ``done``: what finished steps changed, for the line that reports an interruption.
    """

    def __init__(self) -> None:
        self.received: list[int] = []
        self.quiet = False
        self.held = 0
        self.done: list[str] = []

    def handle(self, signum: int, frame: object) -> None:
        self.received.append(signum)
        if not self.quiet and not self.held:
            raise Interrupted(signum)

    def check(self) -> None:
        """Raise again a signal whose exception was swallowed (or held), before work that
        cannot be undone (publishing a report)."""
        if self.received and not self.quiet and not self.held:
            raise Interrupted(self.received[0])


ACTIVE = Signals()  # the signals of the command that is running (stop_signals sets it)


@contextlib.contextmanager
def stop_signals() -> Iterator[Signals]:
    """In the block, SIGINT, SIGTERM and SIGHUP raise ``Interrupted`` (a KeyboardInterrupt), so
    a command stopped by any of them unwinds and its ``finally:`` blocks run; what it yields
    records them, even when the exception is swallowed on the way (Python drops one raised in a
    finalizer or weakref callback, as matplotlib's run during drawing). A signal that is
    ignored (nohup, a background job) or has a handler of someone else's is left alone; the
    previous handlers, and the signals recorded before the block, are back when it ends. Off the
    main thread it changes nothing.
    """
    global ACTIVE
    outer, signals = ACTIVE, Signals()
    ACTIVE = signals
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            if signal.getsignal(signum) in (signal.SIG_DFL, signal.default_int_handler):
                previous[signum] = signal.signal(signum, signals.handle)
    try:
        yield signals
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        ACTIVE = outer  # what this block received stops this command, not the next one


@contextlib.contextmanager
def uninterrupted(done: str) -> Iterator[None]:
    """Run a step that must not stop halfway: a stop signal received in it is held, and raised
    as ``Interrupted`` once the step has ended. ``done`` says what the finished step changed
    ("reports/report.md was replaced"); an interruption after it says so too. An exception
    from the step itself passes through, and ``done`` is not recorded."""
    signals = ACTIVE
    signals.held += 1
    try:
        yield
    finally:
        signals.held -= 1
    signals.done.append(done)
    signals.check()
