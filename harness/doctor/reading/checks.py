"""What the recorded forward fails by itself: what it shows ran, where no probe could measure it.

A softmax over another axis than the keys', heads merged by a reshape that cuts up the queries'
axis, and values rotated by position are wrong whatever the module means; they fail as read. A
wrong scale (or a scale after the softmax) fails as read only where the comparison with SDPA,
which measures it, could not run (projections it does not recognize): there the reading is the
only measurement, and the scale the module means can be declared (--scale). Queries and keys
turned in different pairings of the dimensions as projected, one of them as the user declared
(--rope-pairing), fail as read: the other's weights are read in a layout they were not made
for, which a module trained from scratch would hide from every probe.
"""

from __future__ import annotations

from harness.doctor.findings import FAIL, PASS, Finding
from harness.doctor.reading.known import Reading

NAME = "read from the forward"
MEASURED_BY = "agrees with SDPA"  # the probe that measures a scale
ALWAYS = ("softmax_dim", "head_merge_no_transpose", "rope_on_value")
AGAINST_DECLARED = ("rope_pairing_mismatch",)  # named only against what the user declared
SCALES = frozenset({"missing_scale", "scale_d_model", "double_scale", "wrong_scale",
                    "scale_after_softmax"})  # fmt: skip


def read_failures(reading: Reading, findings: list[Finding]) -> list[Finding]:
    """The failures the reading shows by itself: at most one finding, its traps at their
    lines (the first cause explains it and what else fails)."""
    measured = any(f.probe == MEASURED_BY and f.status in (PASS, FAIL) for f in findings)
    shown = [
        n for n in reading.named
        if not n.located
        and (n.trap in ALWAYS + AGAINST_DECLARED or (n.trap in SCALES and not measured))
    ]  # fmt: skip
    if not shown:
        return []
    said = "; ".join(f"{n.trap}: {n.why} (at {n.line})" for n in shown)
    unmeasured = "" if measured else f"; {MEASURED_BY} could not run, so this is read, not measured"
    return [Finding(NAME, FAIL, said + unmeasured, tuple(dict.fromkeys(n.trap for n in shown)))]
