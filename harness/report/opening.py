"""The top of report.md: what it measures, how to read it (each verdict and column defined once),
the learning probe's method, and how to reproduce it on what."""

from __future__ import annotations

import platform

import torch

from harness import __version__
from harness.arithmetic import describe
from harness.catalogue.card import Card
from harness.catalogue.verdicts import MEANING
from harness.devices import cpu_kernels, device_description, dtype_name
from harness.files import REPORT, TIMINGS
from harness.metrics import GRAD_FACTOR, OUTPUT_FACTOR
from harness.report import learning
from harness.report.format import CPU, DEVICES, NOT_AVAILABLE, VERSIONS
from harness.report.results import Grid
from harness.tally import AGREE, SEEDS


def reproduce_command(grid: Grid) -> str:
    devices = dict.fromkeys(str(d) for d, _ in grid)
    dtypes = dict.fromkeys(dtype_name(t) for _, t in grid)
    words = ["python -m harness report"]
    words += [f"--device {d}" for d in devices] + [f"--dtype {t}" for t in dtypes]
    return " ".join(words)


def seeds_statement(cards: list[Card]) -> str:
    """Which seeds the measurements use."""
    text = "inputs, masks, weights and the upstream gradient from seed 0"
    over_seeds = [f"`{c.id}` over seeds 0-{c.n_seeds - 1}" for c in cards if not c.shared_weights]
    return "; ".join([text, *over_seeds, "the trigger search is derandomized."])


OPENING = """\
# Hand-written attention: the tutorial's claims, measured

A popular tutorial (a Chinese blog post, "why hand-writing attention is the first hurdle")
teaches `softmax(Q K^T / sqrt(d_k)) V`. Here each of its claims is measured."""

WORDS = f"""\
## Words used here

- A **pair**: each trap's two modules, `buggy.py` and `fixed.py` in `pitfalls/<id>/`,
  differing only in marked lines, run on the same weights and inputs.
- **Rounding noise**: fixed.py's error against itself in float64; a difference below it does
  not count. An **ulp**: one step between neighbouring floats.
  **Output error**: buggy.py's largest difference from the float64 run.
- Verdicts: **SILENT**, runs and is wrong; **LOUD**, raises an error;
  **CONDITIONAL**, raises on most shapes, runs silently on some; **NUMERIC**, right in float32,
  broken (NaN or an error) in float16 or on edge inputs; **BENIGN**, within rounding noise: the
  claimed trap does not exist.
- **Training** ("learns slower 4/5"): both modules trained on a tiny task, and what the bug did
  on how many seeds (learns normally, slower, not at all, or *too good to be true*: it read the
  future; *mixed*: no outcome on {AGREE} of {SEEDS}). **Entropy**: how spread out a row of
  weights is, 1 uniform, 0 one key. B, T, h: batch, tokens, heads.
- A **keep-mask** holds 1 (True) where a query may attend. **SDPA**: PyTorch's
  `F.scaled_dot_product_attention`. **The doctor**: this project's checker for any attention
  module, PASS, WARN or FAIL per check."""

READ_ON = """\
## Read on

- [tutorial.md](tutorial.md): each of the tutorial's traps in full (what is true, the diff,
  pictures, training), how each claim above was measured, and the symptoms with their evidence.
- [traps.md](traps.md) and [modern.md](modern.md): the traps the tutorial does not name, in
  classic and in modern attention (rotary, grouped heads, caches).
- [doctor.md](doctor.md): the doctor on every pair, on real libraries and on whole models.
- [tables.md](tables.md): every table behind every verdict.
- [timings.md](timings.md): wall-clock times (the head loop's against fused heads), which each run
  writes afresh."""

CLAIMS_INTRO = """\
# The tutorial's traps, in full

Part of the diagnosis report: [report.md](report.md) holds the tutorial's claims, its code and
the way in from a symptom; this page holds how those were measured and each of the tutorial's
traps, with the traps its claims lead to."""


HOW_TO_READ = """\
## How to read the summary

Each trap's section gives the tutorial's claim, the trap, what is true, what was measured, the
diff of the two files, a picture, what it does to learning, why it matters and how to avoid it;
its full tables are in [tables.md](tables.md)."""

TERMS = """\
"SILENT, NaN": wrong without an error, and some of buggy.py's outputs or gradients are NaN where
fixed.py's are not — often a few rows only, so a loss that averages the other positions or skips
padding may not show it at once. It agrees with an expected SILENT; ", NaN" says how it shows.

- **Floor**: fixed.py's own largest error against the float64 run, in the same dtype: the rounding
  noise a correct module has. buggy.py *differs* when its error exceeds 2 x floor + atol (3 x for
  gradients), where atol is the dtype's rounding of values like the output's.
- **Entropy**: how spread out an attention row is, divided by log(number of keys the row may
  see): 1 is uniform over the allowed keys, 0 is all weight on one key (one-hot); rows with a
  single allowed key are left out. Above 1 means the row puts weight on keys it must not see, or
  is not a distribution at all (it does not sum to 1). A row is *saturated* when one key gets at
  least 0.99 of its weight (a causal mask's first row always is).
- **SDPA**: PyTorch's `F.scaled_dot_product_attention`. **Trigger shape**: a shape on which a bug
  that usually raises runs silently, found by search; its weights can be 1 x 1, so a gradient
  cosine of exactly 1 or -1 there says little. **The doctor**: this project's probes for anyone's
  attention module, run on the catalogue near the end.
- Summary columns: *§*, the tutorial's section that names the trap (— when none does); *verdict* per
  device, for each dtype in the order of the header; *combined*, one verdict per trap (a trap right
  in float32 but broken in a low precision is NUMERIC, however it breaks there); *expected*, the
  catalogue's verdict; *output error / largest output (floor)*, buggy.py's largest output error
  over the largest |value| of the float64 output it is an error of, then the floor, in
  float32, with the weights, inputs and upstream gradient drawn from seed 0 (on the edge inputs
  where the trap's section says so); *seeds 0–9*, the same error with each of ten seeds' draws,
  smallest to largest, and how many seeds' are within the floor (here: within twice their threshold,
  a margin for another CPU's rounding; n/a when buggy.py raises or the
  trap is judged over freshly seeded modules): one seed's number can be several times another's, so
  quote the range; *entropy fix → bug*, the mean entropy of each module's attention rows (n/a: it
  returns no weights; "+k NaN rows" where buggy.py has NaN rows, which the mean leaves out); *grad
  cosine*, the smallest cosine between a weight's gradient in buggy.py and in fixed.py (1 the same
  direction, 0 unrelated, -1 opposite; NaN when a gradient holds NaN)."""


def opening() -> str:
    """The title and what the page answers, then the words it uses, each defined once."""
    return OPENING + "\n\n" + WORDS


def read_on() -> str:
    """Where everything else is."""
    return READ_ON


def how_to_read(learned: bool) -> str:
    """The verdicts and the summary's columns, and the learning probe's method."""
    legend = ["| verdict | meaning |", "|:--|:--|", *(f"| {v} | {m} |" for v, m in MEANING.items())]
    parts = [HOW_TO_READ, "\n".join(legend), TERMS] + ([learning.INTRO] if learned else [])
    return "\n\n".join(parts)


def reproduce(grid: Grid, unavailable: list[str], cards: list[Card], learned: bool) -> str:
    """How to make the report again, and on what it was made."""
    devices = list(dict.fromkeys(d for d, _ in grid))
    dtypes = list(dict.fromkeys(dtype_name(t) for _, t in grid))
    has_cuda = any(d.type == "cuda" for d in devices)
    command = reproduce_command(grid) + ("" if learned else " --no-learn")
    learning_line = (
        "`python -m harness learn ID` trains one trap's pair again and writes its curves."
        if learned
        else "The learning probe was skipped (`--no-learn`)."
    )
    lines = [
        "## Reproduce",
        "",
        f"`{command}` writes this file to `reports/{REPORT}` and its companion pages beside it "
        f"(`--out DIR` elsewhere). {learning_line}",
        "",
        f"{VERSIONS} attention-pitfalls {__version__}, torch {torch.__version__}, "
        f"Python {platform.python_version()}, {platform.machine()}.",
        f"{CPU} {describe(cpu_kernels())}: the learning probe's numbers are this machine's."
        if learned
        else None,
        f"{DEVICES} {', '.join(device_description(d) for d in devices)}."
        + (f"{NOT_AVAILABLE}{', '.join(unavailable)}." if unavailable else ""),
        f"- Dtypes: {', '.join(dtypes)}; the reference is always float64.",
        f"- Seeds: {seeds_statement(cards)}",
        "- TF32: "
        + ("disabled while measuring (float32 means float32)." if has_cuda else "not applicable "
           "(no CUDA device in this run; it is disabled whenever CUDA is measured)."),
        f"- Rule: buggy differs when its max abs error against the float64 reference exceeds "
        f"{OUTPUT_FACTOR:g} x floor + atol for the output ({GRAD_FACTOR:g} x for gradients); the "
        "floor is fixed.py's own error in the same dtype, atol = 2 max|ref + 0.3 - 0.3 - ref| "
        "in that dtype (FlashAttention's test rule).",
        f"- Wall-clock numbers vary from run to run, so they are not in this file: the run writes "
        f"them to `{TIMINGS}` beside it (not committed).",
    ]  # fmt: skip
    return "\n".join(line for line in lines if line is not None)
