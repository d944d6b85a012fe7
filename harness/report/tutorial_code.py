"""report.md's section on the tutorial's own modules (``pitfalls/tutorial.py``): §3.3's example
as written, and what the doctor says of both classes with each mask shape."""

from __future__ import annotations

import pandas as pd

from harness.report.format import anchor, prose
from harness.report.scorecard import TUTORIAL_CODE
from harness.tutorial.own_code import Example, example

FLAGS = "what it flags"  # own_code.diagnoses' column of what the doctor flags


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


def verdict(ex: Example, doctor: pd.DataFrame) -> str:
    """Whether the tutorial's code is right, in a sentence, from its example and the doctor."""
    passes = doctor.groupby("mask", sort=False)["doctor"].apply(lambda d: (d == "healthy").all())
    right = [mask for mask, ok in passes.items() if ok]
    wrong = [mask for mask, ok in passes.items() if not ok]
    if not wrong and ex.as_written == "runs":
        return "So the tutorial's code is right as it stands."
    parts = [f"its arithmetic is right (with a {right[0]} mask)"] if right else []
    shown = [f"its {' and '.join(wrong)} mask"] if wrong else []
    shown += ["its example as written"] if ex.as_written != "runs" else []
    return "So " + ", ".join(parts) + (", but " if parts else "") + " and ".join(shown) + (
        " fails." if len(shown) == 1 else " fail.")  # fmt: skip


def tutorial_code(doctor: pd.DataFrame | None) -> str:
    """The section; ``doctor`` is ``own_code.diagnoses()`` (None: the doctor was not run)."""
    ex = example()
    runs = "runs" if ex.as_written == "runs" else f"raises ({ex.as_written})"
    triangular = ", lower-triangular" if ex.lower_triangular else ", not lower-triangular"
    text = (
        "`pitfalls/tutorial.py` rebuilds the tutorial's `ScaledDotProductAttention` and "
        "`MultiHeadAttention` from its description. §3.3's example "
        f"{runs} as written; with a (1, 3, 3) mask it runs{triangular}."
    )
    if doctor is not None:
        text += (
            " The doctor on both classes (d_model 64, 4 heads): "
            f"{conclusion(doctor)} {verdict(ex, doctor)}"
        )
    return "\n".join([anchor(TUTORIAL_CODE), "## The tutorial's own code", "", prose(text)])


def _first_clause(flagged: str) -> str:
    """What the doctor flags, up to the code it quotes: the trap and its line."""
    return "; ".join(part.split(" `")[0] for part in flagged.split("; "))


CHECK_YOUR_OWN = """\
## Check your own module

In a clone of this project (`.ci/task` sets up its own Python), run the doctor on your class:

```
.ci/task doctor my_attention.py:MultiHeadAttention --mask keep
```

It builds your class from its argument names (`d_model`, `num_heads`, ...), calls its forward
as written (`(x, mask)`, `(q, k, v, mask)`, ...) and names each trap it finds, with its line; a
FAIL exits 1. `--mask keep` says 1 means attend; `--mask-shape b1qk` passes a (B, 1, T, T) mask;
`--help` lists the rest."""


def check_your_own() -> str:
    """Ten lines on running the doctor on one's own module."""
    return CHECK_YOUR_OWN
