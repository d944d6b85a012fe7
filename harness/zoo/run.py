"""Run the zoo's cases under pytest with pytest-xdist and write the table."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from harness.errors import UsageError
from harness.files import write_atomically
from harness.zoo import cases
from harness.zoo.table import markdown, read_rows

# pytest-timeout's limit, past each case's own (rows.LIMIT): a C call that never returns, which
# no signal interrupts, ends its worker (the thread method), and pytest-xdist starts another
CASE_TIMEOUT = 180


def run_zoo(out: Path, workers: str = "auto", select: str = "", timeout: int = CASE_TIMEOUT) -> str:
    """Run every case (``select``: a pytest -k expression) over ``workers`` processes, write
    the table to ``out`` and return its summary."""
    try:
        import transformers  # noqa: F401
        import xdist  # noqa: F401
    except ImportError as exc:
        needed = f"the zoo needs {exc.name}: pip install 'attention-pitfalls[real,zoo]'"
        raise UsageError(needed) from None
    with tempfile.TemporaryDirectory(prefix="attention-zoo-") as rows:
        args = [cases.__file__, "-q", "-p", "xdist", "-n", workers, "--timeout", str(timeout),
                "--timeout-method", "thread",
                "-p", "no:cacheprovider", "--no-header", "-rN",
                "-W", "ignore::pytest.PytestAssertRewriteWarning"]  # fmt: skip
        if select:
            args += ["-k", select]
        os.environ[cases.OUT] = rows
        try:
            pytest.main(args)
        finally:
            del os.environ[cases.OUT]
        found = read_rows(Path(rows))
    if not found:
        raise UsageError(f"no zoo case matched {select!r}")
    text = markdown(found)
    write_atomically(out, text)
    return text.split("\n\n")[1]
