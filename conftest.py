"""Test options and fixtures shared by ``pitfalls/`` and ``tests/``.

``--device`` chooses where the tests run (default: every available device), the ``device`` and
``dtype`` fixtures parametrize over them, and hypothesis loads its ``ci`` profile when ``CI`` is
set and a ``dev`` profile (no deadline) otherwise. Every test of the catalogue (``pitfalls/``)
is marked ``numbers``: it compares measured numbers with the ones its card states, so CI runs
``-m numbers`` again under settings that make this CPU round float32 as others do
(``ATEN_CPU_CAPABILITY=default``, ``MKL_CBWR=COMPATIBLE``, both), where a number that only one
CPU's kernels give fails; ``--keep-report`` keeps each run's generated report for comparing.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from harness.devices import DTYPES, available_devices

# The tensors under test are tiny: one thread is faster, never oversubscribes a small machine,
# and matches the command line (harness.cli pins the same), so regenerated reports compare equal.
torch.set_num_threads(1)

# The report's store of results kept between runs (harness.report.store) in a folder of this run's
# own: a test that compares a fresh run with the committed report measures, never reuses.
os.environ["ATTENTION_PITFALLS_CACHE"] = tempfile.mkdtemp(prefix="attention-pitfalls-store-")
atexit.register(shutil.rmtree, os.environ["ATTENTION_PITFALLS_CACHE"], True)

settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attention-pitfalls", "attention pitfall harness")
    group.addoption(
        "--device",
        action="append",
        choices=["cpu", "cuda"],
        default=None,
        help="device to test on; repeat for several (default: every available device)",
    )
    group.addoption(
        "--keep-report",
        type=Path,
        default=None,
        metavar="DIR",
        help="copy the report that tests/test_report.py generates into DIR (CI compares the "
        "reports made under two arithmetic settings: python -m harness compare)",
    )


CATALOGUE = Path(__file__).resolve().parent / "pitfalls"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if CATALOGUE in item.path.parents:
            item.add_marker(pytest.mark.numbers)


def requested_devices(config: pytest.Config) -> list[str]:
    return config.getoption("--device") or available_devices()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device_name", requested_devices(metafunc.config), scope="session")
    if "dtype" in metafunc.fixturenames:
        metafunc.parametrize("dtype_name", list(DTYPES), scope="session")


@pytest.fixture
def not_ignored() -> Iterator[Callable[[int], None]]:
    """``not_ignored(signum)`` makes a signal's disposition the default for the test, as in an
    ordinary terminal: under nohup, or in a background job of a shell without job control,
    SIGINT or SIGHUP is ignored, and the harness rightly leaves an ignored signal alone."""
    restore = {}

    def default(signum: int) -> None:
        if signal.getsignal(signum) is signal.SIG_IGN:
            restore[signum] = signal.signal(signum, signal.SIG_DFL)

    yield default
    for signum, handler in restore.items():
        signal.signal(signum, handler)


@pytest.fixture(scope="session")
def device(device_name: str) -> torch.device:
    """The torch device under test; skips with a reason when it is not available here."""
    if device_name == "cuda" and not torch.cuda.is_available():
        pytest.skip("--device cuda was requested but torch.cuda.is_available() is False")
    return torch.device(device_name)


@pytest.fixture(scope="session")
def dtype(dtype_name: str) -> torch.dtype:
    """The floating dtype under test: float32, bfloat16 or float16."""
    return DTYPES[dtype_name]
