"""A progress bar on stderr: only on a terminal, and only once work has taken over a second."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``with Progress(n) as bar: bar.step(label)`` once per unit of work."""

    def __init__(self, total: int, stream: TextIO | None = None, delay: float = 1.0):
        self.total = total
        self.stream = stream or sys.stderr
        self.delay = delay
        self.done = 0
        self.start = time.monotonic()
        self.enabled = self.stream.isatty()
        self.shown = False

    def __enter__(self) -> Progress:
        return self

    def step(self, label: str) -> None:
        if self.enabled and time.monotonic() - self.start >= self.delay:
            width = 30
            filled = width * self.done // max(self.total, 1)
            bar = "#" * filled + "." * (width - filled)
            self.stream.write(f"\r[{bar}] {self.done}/{self.total} {label[:40]:<40}")
            self.stream.flush()
            self.shown = True
        self.done += 1

    def __exit__(self, *exc: object) -> None:
        if self.shown:
            self.stream.write("\r" + " " * 90 + "\r")
            self.stream.flush()
