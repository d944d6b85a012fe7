"""The report's independent pieces of work (each trap's measurement, the doctor's tables) on the
cores there are: a pool of forked processes, one torch thread each.

Every piece is seeded by itself, so what it returns does not depend on which process ran it, or
on how many there were: the report's bytes are those of one process. Where processes cannot fork
(Windows) or one worker is asked for, the pieces run here, in order.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch


class Pending(Protocol):
    """A piece of work submitted: ``get`` waits for its result (or raises its exception)."""

    def get(self) -> Any: ...


class _Done:
    """A piece run here, the first time its result is asked for (and kept for the next)."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._fn, self._args = fn, args
        self._result: tuple[Any] | None = None

    def get(self) -> Any:
        if self._result is None:
            self._result = (self._fn(*self._args),)
        return self._result[0]


Submit = Callable[..., Pending]  # submit(fn, *args): a module-level fn, picklable args


def here(fn: Callable[..., Any], *args: Any) -> Pending:
    """``submit`` without workers: ``fn(*args)`` runs here when its result is asked for."""
    return _Done(fn, args)


def available_cores() -> int:
    """The cores this process may run on (its affinity, where the system says)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _started() -> None:
    """A worker: one torch thread; a Ctrl-C is the parent's to handle (it ends the pool), and
    the end it is given is quiet (the parent's handlers, which raise, are not the worker's)."""
    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def pool(workers: int) -> Iterator[Submit]:
    """``submit(fn, *args)`` that runs ``fn(*args)`` in one of ``workers`` forked processes
    (with one worker, or where processes cannot fork: here, when its result is asked for). The
    pool ends with the block, finished or not: a Ctrl-C does not wait for its pieces."""
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        yield here
        return
    # forked after the imports and the catalogue are loaded: a piece is a module-level function
    # and its arguments, pickled to the worker (pairs are passed by id)
    processes = multiprocessing.get_context("fork").Pool(workers, initializer=_started)
    try:
        yield lambda fn, *args: processes.apply_async(fn, args)
        processes.close()
        processes.join()
    finally:
        processes.terminate()
