"""report.md's section on the tutorial's own modules (``pitfalls/tutorial.py``): §3.3's example
as written, and what the doctor says of both classes with each mask shape."""

from __future__ import annotations

import pandas as pd

from harness.report.format import anchor, prose, table
from harness.report.scorecard import TUTORIAL_CODE
from harness.tutorial.own_code import example


def conclusion(doctor: pd.DataFrame) -> str:
    """What the doctor's rows say, per mask shape, in a sentence."""
    parts = []
    for mask, rows in doctor.groupby("mask", sort=False):
        healthy = (rows["doctor"] == "healthy").all()
        warned = rows["what it flags"].str.contains("WARN").any()
        state = (
            "both classes pass"
            if healthy
            else "both classes fail"
            if not (rows["doctor"] == "healthy").any()
            else "one class fails"
        )
        note = " (with a warning: see the table)" if healthy and warned else ""
        parts.append(f"with a {mask} mask {state}{note}")
    return "The doctor: " + "; ".join(parts) + "."


def tutorial_code(doctor: pd.DataFrame | None) -> str:
    """The section; ``doctor`` is ``own_code.diagnoses()`` (None: the doctor was not run)."""
    ex = example()
    example_rows = pd.DataFrame([
        {"mask": "(1, 1, 3, 3), as the example writes it", "result": ex.as_written},
        {"mask": "(1, 3, 3)", "result": f"output {ex.shapes[0]}, weights {ex.shapes[1]}, "
                                        f"lower-triangular: {ex.lower_triangular}"},
    ])  # fmt: skip
    out = [
        anchor(TUTORIAL_CODE),
        "## The tutorial's own code",
        "",
        prose(
            "`pitfalls/tutorial.py` rebuilds the tutorial's `ScaledDotProductAttention` and "
            "`MultiHeadAttention` from its description: the same classes, signatures, "
            "operations and masks (bias-free projections, a float32 tensor scale, `bmm`, "
            "`masked_fill(mask == 0, -inf)`, a `ModuleList` of heads). §3.3's example, three "
            "one-hot tokens with d_model 4, d_k 2, d_v 3:"
        ),
        "",
        table(example_rows),
        "",
    ]
    if doctor is not None:
        out += [
            prose(
                "The doctor on both classes (d_model 64, 4 heads), with the (B, T, T) keep-mask "
                "the code can take and the (B, 1, T, T) one its docstring documents "
                "(`python -m harness doctor pitfalls/tutorial.py:MultiHeadAttention --mask keep "
                "--mask-shape b1qk`):"
            ),
            "",
            table(doctor),
            "",
            prose(conclusion(doctor)),
            "",
        ]
    if ex.as_written != "runs":
        out.append(prose(f"§3.3's example does not run as written: {ex.as_written} (`mask_rank`)."))
    return "\n".join(out)


CHECK_YOUR_OWN = """\
## Check your own module

Put your attention class in a file and run the doctor on it with `.ci/task doctor`, this
project's checker for anyone's attention (its first call sets up the project's Python in `.venv`,
as the README's quick start says; after that, `.venv/bin/python -m harness doctor` is the same
command). It builds the class from its argument names (d_model 64, 4 heads, ...), calls its
forward as it is written (`forward(x, mask)`, `forward(q, k, v, mask)` and the other common
forms), runs every probe (one check each: no future leak, batch elements kept apart, agreement
with PyTorch's own attention, ...) and prints PASS, WARN or FAIL per probe, with the trap it
names (exit 1 on a FAIL):

```
.ci/task doctor my_attention.py:MultiHeadAttention --mask keep
.ci/task doctor my_attention.py:MultiHeadAttention --mask keep --mask-shape b1qk
```

`--mask keep` says that 1 (or True) marks a key to attend (`drop` the opposite, `additive` a
float mask added to the scores); `--mask-shape b1qk` hands it a (B, 1, T, T) mask (batch, one
for every head, queries, keys) instead of (B, T, T). The tutorial's own module is the worked
example: `pitfalls/tutorial.py` in place of `my_attention.py` gives the table above. `.ci/task
doctor --help` lists every option."""


def check_your_own() -> str:
    """Ten lines on running the doctor on one's own module."""
    return CHECK_YOUR_OWN
