"""One row of the zoo's table: whether the model built, whether the doctor ran on it, its
verdict and, for a failure, which probe and the evidence."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from torch import nn

from harness.doctor.findings import FAIL
from harness.doctor.model.examine import diagnose_model
from harness.errors import shorten
from harness.runner import describe

TIMEOUT = 60.0  # seconds per probe

# Architectures the doctor calls unhealthy for a defect reproduced and explained (the zoo's
# table states the evidence): model type -> what is wrong.
KNOWN: dict[str, str] = {}


@dataclass
class Row:
    case: str
    class_name: str
    built: bool = False
    ran: bool = False
    healthy: bool = False
    layers: int = 0  # attention layers found
    groups: int = 0  # of them, probed
    failed: list[str] = field(default_factory=list)  # "where: probe"
    evidence: str = ""  # the first failure's, or why it did not build or run
    expected: str = ""  # an injected bug: the probe that must fail
    caught: bool = False
    known: str = ""
    seconds: float = 0.0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def diagnose_row(
    case: str, class_name: str, make: Callable[[], nn.Module], expect: str = ""
) -> Row:
    """Build the model with ``make`` and diagnose it; nothing raises out of here."""
    row = Row(case, class_name, expected=expect, known=KNOWN.get(case.rsplit("-", 2)[0], ""))
    try:
        model = make()
    except Exception as exc:
        row.evidence = shorten(describe(exc), 200)
        return row
    row.built = True
    try:
        diagnosis = diagnose_model(model, target=case, timeout=TIMEOUT)
    except Exception as exc:  # a usage error: the doctor cannot call its forward
        row.evidence = shorten(describe(exc), 200)
        return row
    row.ran = True
    row.healthy = diagnosis.healthy
    row.layers = sum(len(g.paths) for g in diagnosis.groups)
    row.groups = len(diagnosis.groups)
    failures = [(g.paths[0], f) for g in diagnosis.groups for f in g.diagnosis.findings
                if f.status == FAIL]  # fmt: skip
    failures += [("model", f) for f in diagnosis.properties if f.status == FAIL]
    row.failed = [f"{where}: {f.probe}" for where, f in failures]
    if failures:
        where, first = failures[0]
        row.evidence = shorten(f"{where}: {first.probe}: {first.message}", 300)
    row.caught = bool(expect) and any(f.probe == expect for _, f in failures)
    return row
