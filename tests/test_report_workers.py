"""The report's workers: forked processes on one torch thread each, whose results are the bytes
the report would have made in one process."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from harness.catalogue import registry
from harness.files import IMAGES
from harness.report import write
from harness.report.build import learned, measured
from harness.report.store import Store
from harness.report.workers import pool

GRID = [(torch.device("cpu"), torch.float32)]


def _state() -> tuple[int, bool, bool, int]:
    quiet = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    ends = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    return torch.get_num_threads(), quiet, ends, os.getpid()


def test_a_worker_runs_one_thread_and_leaves_ctrl_c_to_the_parent():
    with pool(2) as submit:
        threads, quiet, ends, pid = submit(_state).get()
    assert (threads, quiet, ends) == (1, True, True) and pid != os.getpid()


def test_one_worker_is_this_process():
    with pool(1) as submit:
        assert submit(os.getpid).get() == os.getpid()


def test_a_trap_measured_and_drawn_by_a_worker_is_the_one_made_here():
    here, drawn_here = measured("mask_bool", GRID)
    with pool(2) as submit:
        there, drawn_there = submit(measured, "mask_bool", GRID).get()
    assert drawn_here and drawn_there == drawn_here
    assert there.detection == here.detection
    assert there.cells[0].output.equals(here.cells[0].output)
    assert there.spread == here.spread


def test_pictures_a_worker_drew_are_written_not_drawn_again(tmp_path, monkeypatch):
    kept, pictures = measured("mask_bool", GRID)
    result = kept.result(registry.load("mask_bool"), pictures=pictures)
    monkeypatch.setattr(write, "draw", lambda *args: pytest.fail("drawn again"))
    (tmp_path / IMAGES).mkdir()
    names = write.drawn_or_kept(result, tmp_path, Store(None))
    assert names == list(pictures)
    assert all((tmp_path / name).read_bytes() == pictures[name] for name in names)


def test_leaving_the_block_early_ends_the_workers():
    with pytest.raises(KeyboardInterrupt), pool(2) as submit:
        worker = submit(os.getpid).get()
        submit(time.sleep, 60)
        raise KeyboardInterrupt
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)  # ended and reaped, not left running


def test_pictures_drawn_in_two_pieces_are_the_ones_drawn_in_one():
    """A trap's measurement and its learning probe are drawn by the pieces that made them."""
    kept, measurement = measured("mask_bool", GRID)
    [(kept.learning, learning)] = learned(("mask_bool",), GRID[0][0])
    whole = write.drawn_bytes(kept.result(registry.load("mask_bool")))
    assert measurement and learning and {**measurement, **learning} == whole
