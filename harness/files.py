"""Writing files safely: check a destination before any work, replace a file in one step."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from harness.errors import UsageError


def ensure_writable(out: Path) -> None:
    """UsageError unless ``out`` is (or can be made) a folder we can write into."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".probe-"):
            pass
    except OSError as exc:
        raise UsageError(f"cannot write to --out {str(out)!r}: {exc.strerror or exc}") from None


def write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder."""
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".tmp-", delete=False) as tmp:
        tmp.write(text)
    os.replace(tmp.name, path)
