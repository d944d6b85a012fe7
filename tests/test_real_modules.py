"""The doctor on real libraries' attention modules (harness.realmodules): correct ones healthy,
misused ones failing on the right probe with their own evidence."""

from __future__ import annotations

import pytest

from harness.realmodules import CASES, Case, LibraryMissing, diagnosed, verdict_ok


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_real_module(case: Case) -> None:
    try:
        diagnosis = diagnosed(case)
    except LibraryMissing as missing:
        pytest.skip(f"{missing} not installed (the real extra)")
    ok, why = verdict_ok(case, diagnosis)
    assert ok, f"{why}:\n{diagnosis.text()}"
