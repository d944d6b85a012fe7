"""The errors the harness reports to its users, as opposed to bugs it measures."""

from __future__ import annotations

import difflib
import signal
from collections.abc import Iterable


class UsageError(ValueError):
    """Bad input from the user: reported as one line, exit status 2."""


class Interrupted(KeyboardInterrupt):
    """A signal that stops a command (SIGINT, SIGTERM, SIGHUP), raised where the program is so
    that it unwinds as Ctrl-C does: its ``finally:`` blocks run.

    A ``KeyboardInterrupt``, so code that lets Ctrl-C through lets it through too.
    """

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signum)
        self.signum = int(signum)

    @property
    def exit_status(self) -> int:
        """128 + the signal's number, as a shell reports a process killed by it (130: Ctrl-C)."""
        return 128 + self.signum

    def line(self, prog: str) -> str:
        """``prog: interrupted``, with the signal's name unless it is Ctrl-C's."""
        name = "" if self.signum == signal.SIGINT else f" ({self.signal_name})"
        return f"{prog}: interrupted{name}"

    @property
    def signal_name(self) -> str:
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"


def shorten(text: object, limit: int = 60, *, quote: bool = False) -> str:
    """``text`` as an error message may echo it: on one line, and at most ``limit`` characters.

    Control characters are escaped; a longer text is cut to its first ``limit`` characters, an
    ellipsis and its length: ``'aaaa…' (100000 characters)``. ``quote`` quotes it as ``repr``.
    """
    text = str(text)
    head = text[:limit]
    shown = repr(head) if quote else printable(head, keep="")
    if len(text) <= limit:
        return shown
    return f"{shown}… ({len(text)} characters)"


def printable(text: str, keep: str = "\n\t") -> str:
    """``text`` with its control characters escaped, those in ``keep`` aside (line breaks and
    tabs): what user code said (an error message) may carry a terminal's escape codes, which
    must not reach it raw."""
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)


def did_you_mean(word: str, choices: Iterable[str], *, limit: int = 100) -> str:
    """``did you mean 'cuda'?`` for the choices close to ``word``, or ``""`` when none is."""
    if len(word) > limit:  # a pasted paragraph resembles nothing
        return ""
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    if not close:
        return ""
    quoted = [repr(c) for c in close]
    listed = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
    return f"did you mean {listed}?"
