"""report.md's section on the tutorial's own modules (``pitfalls/tutorial.py``): §3.3's example
as written, and what the doctor says of both classes with each mask shape."""

from __future__ import annotations

import pandas as pd

from harness.report.format import anchor, prose, table
from harness.report.scorecard import TUTORIAL_CODE
from harness.tutorial.own_code import example


def conclusion(doctor: pd.DataFrame) -> str:
    """What the doctor's rows say, per mask shape, in a sentence: whether the classes pass, and
    what it flags (the trap and its line)."""
    parts = []
    for mask, rows in doctor.groupby("mask", sort=False):
        healthy = rows["doctor"] == "healthy"
        state = "both classes pass" if healthy.all() else (
            "both classes fail" if not healthy.any() else "one class fails")  # fmt: skip
        flagged = list(dict.fromkeys(rows[FLAGS].map(_first_clause)))
        parts.append(f"with a {mask} mask {state} ({'; '.join(flagged)})")
    return "; ".join(parts) + "."


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
            "`MultiHeadAttention` from its description. §3.3's example, three one-hot tokens "
            "with d_model 4, d_k 2, d_v 3:"
        ),
        "",
        table(example_rows),
        "",
    ]
    if doctor is not None:
        out += [
            prose(
                "The doctor (see below) on both classes, d_model 64 and 4 heads, the second "
                f"mask as their docstring documents it: {conclusion(doctor)}"
            ),
        ]
    return "\n".join(out).rstrip("\n")


FLAGS = "what it flags"


def _first_clause(flagged: str) -> str:
    """What the doctor flags, up to the code it quotes: the trap and its line."""
    return "; ".join(part.split(" `")[0] for part in flagged.split("; "))


CHECK_YOUR_OWN = """\
## Check your own module

Run the doctor, this project's checker for anyone's attention, on your class (the first
`.ci/task` call sets up the project's Python in `.venv`):

```
.ci/task doctor my_attention.py:MultiHeadAttention --mask keep
```

It builds the class from its argument names, calls its forward as written, runs one probe per
kind of trap (no future leak, batch elements kept apart, agreement with SDPA, ...) and prints
PASS, WARN or FAIL for each, with the trap and the line it points at; a FAIL exits 1. `--mask
keep` says 1 means attend (`drop` the opposite, `additive` a float mask added to the scores);
`--mask-shape b1qk` hands it a (B, 1, T, T) mask, as the tutorial's docstring documents, which
is how the table above was made. `.ci/task doctor --help` lists every option."""


def check_your_own() -> str:
    """Ten lines on running the doctor on one's own module."""
    return CHECK_YOUR_OWN
