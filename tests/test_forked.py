"""One call on the other core: its result, its exception, and no child left behind."""

import os
import time

import pytest

from harness.forked import forked


def _pid_and(value):
    return os.getpid(), value * 2


def _fails():
    raise ValueError("in the child")


def _sleeps():
    time.sleep(60)


def test_the_result_comes_back_from_another_process():
    with forked(_pid_and, 21) as result:
        pid, value = result()
    assert value == 42 and pid != os.getpid()


def test_the_childs_exception_is_raised_in_the_parent():
    with forked(_fails) as result, pytest.raises(ValueError, match="in the child"):
        result()


def test_leaving_the_block_ends_a_child_still_running():
    started = time.perf_counter()
    with pytest.raises(KeyboardInterrupt), forked(_sleeps):
        raise KeyboardInterrupt  # a Ctrl-C in the parent's block
    assert time.perf_counter() - started < 10


def test_without_fork_the_call_runs_here_when_asked(monkeypatch):
    monkeypatch.setattr("multiprocessing.get_all_start_methods", lambda: ["spawn"])
    with forked(_pid_and, 2) as result:
        assert result() == (os.getpid(), 4)
