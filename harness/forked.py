"""One call on the other core: a forked child runs it while the parent goes on, and ends with
the parent's block whatever happens there (a Ctrl-C does not wait for it)."""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any


def _run(send: Connection, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        send.send((True, fn(*args)))
    except BaseException as exc:  # the parent raises it when it asks for the result
        send.send((False, exc))
    finally:
        send.close()


@contextlib.contextmanager
def forked(fn: Callable[..., Any], *args: Any) -> Iterator[Callable[[], Any]]:
    """Start ``fn(*args)`` in a forked child; yield what waits for its result (or raises its
    exception). The child is ended when the block exits, finished or not. Where processes
    cannot fork (Windows), the call runs in this process when its result is asked for."""
    if "fork" not in multiprocessing.get_all_start_methods():
        yield lambda: fn(*args)
        return
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_run, args=(send, fn, args), daemon=True)
    child.start()
    send.close()

    def result() -> Any:
        try:
            ok, value = receive.recv()
        except EOFError:
            raise RuntimeError(f"the forked {fn.__name__} ended without a result") from None
        if not ok:
            raise value
        return value

    try:
        yield result
    finally:
        if child.is_alive():
            child.terminate()
        child.join()
        receive.close()
