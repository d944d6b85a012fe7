"""The --device option and fixtures of the project's conftest, run inside pytest."""

from pathlib import Path

import pytest
import torch

pytest_plugins = ["pytester"]

ROOT_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
USES_FIXTURES = """
def test_runs_on(device, dtype):
    assert device.type in ("cpu", "cuda") and dtype.is_floating_point
"""


def run(pytester, *args):
    pytester.makeconftest(ROOT_CONFTEST.read_text())
    pytester.makepyfile(USES_FIXTURES)
    return pytester.runpytest("-p", "no:cacheprovider", "-rs", *args)


def test_default_runs_every_available_device_and_three_dtypes(pytester):
    devices = 2 if torch.cuda.is_available() else 1
    run(pytester).assert_outcomes(passed=3 * devices)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_absent_device_is_skipped_with_a_reason(pytester):
    result = run(pytester, "--device", "cuda")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines(["*--device cuda was requested but*is False*"])


def test_device_option_is_in_its_group(pytester):
    pytester.makeconftest(ROOT_CONFTEST.read_text())
    pytester.runpytest("--help").stdout.fnmatch_lines(["*attention pitfall harness*", "*--device*"])


def test_every_catalogue_test_is_marked_to_run_again_on_portable_kernels(pytester):
    """CI runs ``-m numbers`` with ATEN_CPU_CAPABILITY=default: every test under pitfalls/
    (they hold measurements to the numbers their cards state) is among them, no other test
    unless marked."""
    pytester.makeconftest(ROOT_CONFTEST.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    numbers: compares numbers\n")
    pytester.mkdir("pitfalls").joinpath("test_card.py").write_text("def test_card(): pass\n")
    pytester.mkdir("tests").joinpath("test_engine.py").write_text("def test_engine(): pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "-m", "numbers", "-v")
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.fnmatch_lines(["*pitfalls/test_card.py::test_card PASSED*"])
