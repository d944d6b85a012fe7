"""What the recorded forward fails by itself: what it shows ran, where no probe could measure it.

A softmax over another axis than the keys', heads merged by a reshape that cuts up the queries'
axis, and values rotated by position are wrong whatever the module means; they fail as read. A
wrong scale (or a scale after the softmax) fails as read only where the comparison with SDPA,
which measures it, could not run (projections it does not recognize): there the reading is the
only measurement, and the scale the module means can be declared (--scale); so do heads split
by a reshape that cuts up the positions' axis, where no probe that sees positions mixed with
features could run (a grid of patches, with positions declared). Queries and keys
turned in different pairings of the dimensions as projected, one of them as the user declared
(--rope-pairing), fail as read: the other's weights are read in a layout they were not made
for, which a module trained from scratch would hide from every probe.
"""

from __future__ import annotations

from harness.doctor.findings import FAIL, PASS, Finding
from harness.doctor.reading.known import Reading

NAME = "read from the forward"
MEASURED_BY = "agrees with SDPA"  # the probe that measures a scale
# the probes that see positions mixed with features, as heads split by a reshape that cuts up
# the positions' axis mix them: where none could run, the reading is the only measurement
SPLIT_MEASURED_BY = ("permutation equivariance", "causal no-leak", MEASURED_BY)
# the probes that see a rotation whose table is laid out for the other pairing (the scores
# then follow absolute positions): where neither could run, the reading is the only one
PAIRING_MEASURED_BY = ("position shift", MEASURED_BY)
ALWAYS = ("softmax_dim", "head_merge_no_transpose", "rope_on_value")
AGAINST_DECLARED = ("rope_pairing_mismatch",)  # named only against what the user declared
SCALES = frozenset({"missing_scale", "scale_d_model", "double_scale", "wrong_scale",
                    "scale_after_softmax"})  # fmt: skip


def read_failures(reading: Reading, findings: list[Finding]) -> list[Finding]:
    """The failures the reading shows by itself: at most one finding, its traps at their
    lines (the first cause explains it and what else fails)."""
    ran = {f.probe for f in findings if f.status in (PASS, FAIL)}
    measured = MEASURED_BY in ran
    read_only = {*(SCALES if not measured else ()),
                 *(("head_split_view",) if not ran & set(SPLIT_MEASURED_BY) else ())}  # fmt: skip
    tables_unmeasured = not ran & set(PAIRING_MEASURED_BY)
    shown = [
        n for n in reading.named
        if (not n.located and (n.trap in ALWAYS + AGAINST_DECLARED or n.trap in read_only))
        or (n.located and n.trap == "rope_pairing_mismatch" and tables_unmeasured)
    ]  # fmt: skip
    if not shown:
        return []
    said = "; ".join(f"{n.trap}: {n.why} (at {n.line})" for n in shown)
    unmeasured = "" if measured else f"; {MEASURED_BY} could not run, so this is read, not measured"
    return [Finding(NAME, FAIL, said + unmeasured, tuple(dict.fromkeys(n.trap for n in shown)))]
