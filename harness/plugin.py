"""A pytest plugin: the ``attention_doctor`` fixture, for any project that installs this one.

    def test_attn(attention_doctor):
        attention_doctor(MyAttention(64, 4), mask="keep")

    @pytest.mark.attention_doctor(mask="keep")       # or declared once, for a test or a class
    def test_attn_declared(attention_doctor):
        attention_doctor(MyAttention(64, 4))

fails with the doctor's findings when a probe fails (or warns, with ``strict=True`` or
``--attention-doctor-strict``), and with the change to write where a trap's line has a fix the
doctor proved by diagnosing the changed code. Registered through the ``pytest11`` entry point,
so it loads in every pytest run of an environment that has the package: it imports nothing
heavy (torch, pandas, the doctor) until a test asks for the fixture.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace
from typing import TYPE_CHECKING

import pytest

from harness.doctor.options import keywords_doc

if TYPE_CHECKING:
    from torch import nn

    from harness.doctor import Diagnosis


class AttentionDoctorFailure(AssertionError):
    """The doctor found problems; the message lists every finding."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attention-doctor", "attention doctor")
    group.addoption(
        "--attention-doctor-strict",
        action="store_true",
        default=False,
        help="attention_doctor: warnings fail the test too",
    )


MARKER = "attention_doctor"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(**options): the doctor's options for the attention_doctor fixture in this "
        "test, class or module (a call's own keywords outrank them)",
    )


def attention_doctor(request: pytest.FixtureRequest) -> Callable[..., Diagnosis]:
    from harness.doctor import TIMEOUT, Config, diagnose
    from harness.doctor.examine import called_once
    from harness.errors import UsageError

    strict_default = request.config.getoption("--attention-doctor-strict")

    marked = request.node.get_closest_marker(MARKER)
    declared = dict(marked.kwargs) if marked is not None else {}

    def check(module: nn.Module, timeout: float | None = TIMEOUT, **options: object) -> Diagnosis:
        __tracebackhide__ = True  # a failure points at the test, not into the plugin
        options = {**declared, **options}  # the call's keywords outrank the marker's
        timeout = options.pop("timeout", timeout)  # type: ignore[assignment]
        options.setdefault("strict", strict_default)
        unknown = sorted(set(options) - {f.name for f in fields(Config)})
        if unknown:
            known = ", ".join([*(f.name for f in fields(Config)), "timeout"])
            pytest.fail(f"attention_doctor: no option {unknown[0]!r}; use {known}", pytrace=False)
        config = Config(**options)
        name = type(module).__name__
        try:
            diagnosis = diagnose(module, config, name, timeout)
        except UsageError as exc:  # bad input, as the command line reports it: one line
            raise pytest.fail.Exception(f"attention_doctor: {exc}", pytrace=False) from None
        if not diagnosis.healthy:  # the failure says what to write, where it is proven
            from harness.doctor.fixes import propose  # LibCST: only where there is a fault

            fixes = propose(
                diagnosis,
                lambda: diagnose(module, config, name, timeout),
                lambda seq_len=None, unpadded=False: called_once(
                    module, config, timeout, seq_len, unpadded
                ),
                lambda: called_once(module, replace(config, mask="none"), timeout),
            )
            fixes.onto(diagnosis)
            raise AttentionDoctorFailure(diagnosis.text())
        return diagnosis

    return check


attention_doctor.__doc__ = f"""Diagnose a self-attention module; assert that it is healthy.

Call it with the module and the doctor's options as keywords (or declare them once with the
``@pytest.mark.attention_doctor(**options)`` marker on the test, its class or its module); it
returns the Diagnosis when
healthy and raises an AssertionError listing the findings otherwise. Bad options (an unknown one,
a device that is not available here) fail the test with one line, before any probe runs. The
options, as ``python -m harness doctor --help`` gives them (one table, harness.doctor.options):

{keywords_doc()}
"""
attention_doctor = pytest.fixture(attention_doctor)
