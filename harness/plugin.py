"""A pytest plugin: the ``attention_doctor`` fixture, for any project that installs this one.

    def test_attn(attention_doctor):
        attention_doctor(MyAttention(64, 4), mask="keep")

fails with the doctor's findings when a probe fails (or warns, with ``strict=True`` or
``--attention-doctor-strict``). Registered through the ``pytest11`` entry point, so it loads in
every pytest run of an environment that has the package: it imports nothing heavy (torch, pandas,
the doctor) until a test asks for the fixture.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

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


@pytest.fixture
def attention_doctor(request: pytest.FixtureRequest) -> Callable[..., Diagnosis]:
    """Diagnose a self-attention module; assert that it is healthy.

    Call it with the module and the doctor's options (``mask``, ``causal``, ``mask_shape``,
    ``mask_dtype``, ``positional``, ``strict``, ``batch``, ``seq_len``, ``device``). It returns
    the Diagnosis when healthy and raises an AssertionError listing the findings otherwise.
    """
    from harness.doctor import Config, diagnose

    strict_default = request.config.getoption("--attention-doctor-strict")

    def check(module: nn.Module, **options: object) -> Diagnosis:
        options.setdefault("strict", strict_default)
        diagnosis = diagnose(module, Config(**options), type(module).__name__)
        if not diagnosis.healthy:
            raise AttentionDoctorFailure(diagnosis.text())
        return diagnosis

    return check
