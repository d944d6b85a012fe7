"""The zoo's cases, one per architecture and one per injected bug: a pytest file, run by
``python -m harness zoo`` (pytest-xdist spreads them over the cores; the environment's
``ATTENTION_ZOO_OUT`` names the folder each case writes its row to). Not collected by the
project's own test run.

An architecture's case fails when the doctor calls the model unhealthy, unless the row of
``KNOWN`` explains the defect; an injected bug's case fails unless the probe it names fails.
"""

from __future__ import annotations

import json
import os
import re
import resource
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from harness.zoo.architectures import Architecture, architectures
from harness.zoo.bugs import BUGS, Bug
from harness.zoo.rows import Row, diagnose_row

ARCHITECTURES = architectures()
torch.set_num_threads(1)  # one process per core: pytest-xdist spreads the cases
# A tiny model that is not tiny (a vision tower, a table sized by a field the size table does
# not know) fails its case with an allocation error instead of taking the machine's memory:
# each case may grow the worker's data by this much over what it holds when the case starts.
MEMORY = 4 * 2**30


def _data_bytes() -> int:
    """The process's data segment now (Linux's VmData), 0 where it cannot be read."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return 0
    found = re.search(r"^VmData:\s+(\d+) kB", status, re.MULTILINE)
    return int(found[1]) * 1024 if found else 0


@pytest.fixture(autouse=True)
def memory_limit() -> Iterator[None]:
    """The case's allocations capped at MEMORY more than the worker holds, then lifted."""
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    held = _data_bytes()
    if held:
        cap = held + MEMORY
        unlimited = hard == resource.RLIM_INFINITY
        resource.setrlimit(resource.RLIMIT_DATA, (cap if unlimited else min(cap, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def _write(folder: Path, row: Row) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{row.case}.json").write_text(json.dumps(row.as_dict(), indent=1))


OUT = "ATTENTION_ZOO_OUT"


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """The folder rows are written to: $ATTENTION_ZOO_OUT, else the test's own."""
    return Path(os.environ.get(OUT) or tmp_path)


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=[a.id for a in ARCHITECTURES])
def test_architecture(arch: Architecture, out: Path) -> None:
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = diagnose_row(arch.id, arch.class_name, arch.build)
    row.seconds = time.perf_counter() - started
    _write(out, row)
    if row.built and row.ran and not row.healthy and not row.known:
        pytest.fail(f"{arch.id}: called unhealthy: {row.evidence}", pytrace=False)


@pytest.mark.parametrize("bug", BUGS, ids=[b.id for b in BUGS])
def test_injected(bug: Bug, out: Path) -> None:
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = diagnose_row(bug.id, bug.class_name, bug.build, expect=bug.probe, trap=bug.trap)
    row.seconds = time.perf_counter() - started
    _write(out, row)
    why = row.evidence or "healthy"
    assert row.caught, f"{bug.id}: {bug.probe} did not fail naming {bug.trap} ({why})"
