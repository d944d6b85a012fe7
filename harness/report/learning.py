"""The learning probe in the report: the summary's "learns?" cell, each trap's paragraph and
table, and the findings where learning and the one-pass verdict disagree.

Training amplifies rounding: a curve made on another CPU drifts from this one over the steps, so
a trap's learning block sits between ``format.LEARNING_START`` and ``LEARNING_END``, whose
numbers are compared across machines only in their words (reproducible on one machine, as the
rest of the report is).
"""

from __future__ import annotations

import math

from harness.catalogue.card import Card
from harness.catalogue.verdicts import Verdict
from harness.learning import (
    BATCH,
    D_MODEL,
    ENDS_BELOW,
    EVAL_BATCH,
    FLAT_GAIN,
    LEARNS,
    LR,
    NO_BASELINE,
    RAISES,
    SEQ_LEN,
    SLOWER,
    STEPS,
    THRESHOLD,
    VOCAB,
    WORSE,
    Learning,
)
from harness.report.format import (
    FLOAT,
    LEARNING_AGREES,
    LEARNING_DISAGREES,
    LEARNING_END,
    LEARNING_START,
    prose,
)
from harness.tally import AGREE, ALPHA, MIXED, SEEDS

INTRO = prose(
    f"**The learning probe** (the summary's *learns? task: fix / bug* and each trap's \"What it "
    f'does to learning"): one pass does not say whether a bug stops a model from learning, so both '
    f"modules are trained, from the same initial weights on the same seeded batches, inside a "
    f"tiny model (a token embedding plus an embedding of the token before, the attention "
    f"module, a linear read-out; vocab {VOCAB}, {SEQ_LEN} tokens, d_model {D_MODEL}, batch "
    f"{BATCH}, Adam at {LR:g}, {STEPS} steps, float32 on the CPU). Bidirectional modules learn "
    f"associative recall (key-value pairs, then queries); causal ones learn to copy a prompt "
    f"of distinct tokens (from the second copy on, the next token is found where the current "
    f"one appeared before). The loss and the accuracy are taken on these answers only. *Steps "
    f"to {THRESHOLD:.0%}*: the first step at which the answer accuracy, averaged over the last "
    f"10 steps, reaches {THRESHOLD:.0%} (each step's batch is new, so it is a held-out "
    f"accuracy); *loss, first 10*, *loss, last 10* and *accuracy, last 10*: means over those "
    f"steps. A trained model is "
    f"then evaluated in eval mode on {EVAL_BATCH} fixed rows: *teacher-forced*, the whole "
    f"sequence in one call as in training, and, for causal modules, *by generation*: each "
    f"token from the tokens before it only, through the module's own cache where it has one. "
    f"*Unknowable*: the prompt's next tokens, which no causal model can know; a module that "
    f"predicts them reads the future. In the summary, *learns? task: fix / bug* gives the task "
    f'(copy or recall), then "yes (n)" when '
    f"fixed.py reaches {THRESHOLD:.0%} in n steps (on the seed shown), then what the bug does on "
    f"each seed, tallied (below): *learns normally* "
    f"(×ratio of steps; *identical training* where the bug does not touch a full forward of "
    f"the task); *learns faster* or *slower* (×ratio of steps to {THRESHOLD:.0%}, {SLOWER:g}x "
    f"or more, or ending {ENDS_BELOW:g} below fixed.py's accuracy; \"never {THRESHOLD:.0%}: "
    f"×>r\" when it did not get there in the steps run, r times fixed.py's); *does not learn* "
    f"(accuracy rises by less than {FLAT_GAIN:g}); *diverges or NaN*; *too good to be true* "
    f"(it predicts the unknowable teacher-forced and loses it by generation); *wrong in "
    f"generation* (right teacher-forced, wrong by generation); *worse in evaluation* (in eval "
    f"mode it falls at least {WORSE:g} further behind fixed.py's accuracy than over its last "
    f"training steps); *raises*; *no conclusion* when fixed.py itself does not learn. Training "
    f"amplifies rounding, so no single run is the claim: every trap is trained on the same "
    f'{SEEDS} seeds, and what the bug does is their tally, claim first ("learns slower 4/5 · '
    f'learns normally 1/5"): an outcome is claimed when at least {AGREE} of {SEEDS} seeds give '
    f"it, else the tally is *mixed*. Another CPU gives other numbers and may move a seed across "
    f"a threshold; two tallies differ only where Fisher's exact test says so (p < {ALPHA:g}: "
    f"with {SEEDS} seeds a side, all against none). The numbers, table and picture are those of "
    f"the first seed that gives the claim (named in the text). Each picture shows both loss "
    f"curves on a log axis, then the attention each module gives the first evaluation row "
    f"after training (heads averaged, blocked keys hatched; by generation where the bug is "
    f"wrong only there); it is drawn only where the bug changes learning: a bug that learns "
    f"normally runs along fixed.py's curve, and its section says so instead. These numbers are "
    f"the same on this machine run after run, and drift on another CPU (or with other kernels "
    f"on this one)."
)


def fixed_cell(learning: Learning) -> str:
    """Whether fixed.py learns the task, and in how many steps."""
    steps = learning.fix.steps_to_threshold
    return "no" if steps is None else f"yes ({steps})"


def learns_cell(learning: Learning) -> str:
    """The summary's cell: the task, fixed.py's outcome / what the bug does."""
    return f"{learning.task.name}: {fixed_cell(learning)} / {learning.diagnosis.label}"


def finding(card: Card, verdict: Verdict, learning: Learning) -> str | None:
    """A sentence where learning and the one-pass verdict disagree: a SILENT trap that learns
    normally here, or a BENIGN one that learns differently."""
    d = learning.diagnosis
    if d.kind == NO_BASELINE:
        return None
    harmless = d.kind == LEARNS
    if verdict is Verdict.SILENT and harmless and d.identical:
        return (
            "**A finding.** One pass measures this trap as SILENT, yet on this task both modules "
            "train identically: the bug does not touch a full forward of these inputs. What it "
            "does elsewhere (other inputs or shapes, generation, weights not trained with it) "
            "is what the section measures; the table shows how generation compares here."
        )
    if verdict is Verdict.SILENT and harmless:
        return (
            f"**A finding.** One pass measures this trap as SILENT, yet on this task buggy.py "
            f"learns within this report's thresholds (seed {d.first_seed + d.shown}: "
            f"×{d.ratio:.3g} the steps to 90%, less than "
            f"×{SLOWER:g}, and ending within {ENDS_BELOW:g} of fixed.py's accuracy): trained "
            "from scratch, the model largely adapts to the bug. The harm the section measures "
            "needs what training from scratch on this task does not have: weights made for the "
            "correct code, or other inputs."
        )
    if verdict is Verdict.BENIGN and not harmless and d.kind not in (RAISES, MIXED):
        return (
            f"**A finding.** One pass measures this trap as BENIGN, yet in training buggy.py "
            f"{d.label}."
        )
    return None


def learning_block(
    card: Card, verdict: Verdict, learning: Learning, image: str | None
) -> list[str]:
    """A trap's paragraph on learning, its table and its curves, between the block markers."""
    d = learning.diagnosis
    shown = d.seeds[d.shown]
    text = (
        f"**What it does to learning.** Trained on {learning.task.describe()} (a loss of "
        f"ln {VOCAB} = {math.log(VOCAB):.2f} is chance), over seeds {d.first_seed}–"
        f"{d.first_seed + len(d.seeds) - 1}: buggy.py **{d.label}**. Seed "
        f"{d.first_seed + d.shown}, in the table{' and picture' if image else ''}: fixed.py "
        + (
            f"reaches {THRESHOLD:.0%} in {learning.fix.steps_to_threshold} steps; "
            if learning.fix.steps_to_threshold is not None
            else f"does not reach {THRESHOLD:.0%}; "
        )
        + f"buggy.py {shown.label}: {shown.evidence.rstrip('.')}."
    )
    lines = [LEARNING_START, prose(text), ""]
    if learning.note:
        lines += [prose(learning.note), ""]
    if said := finding(card, verdict, learning):
        lines += [prose(said), ""]
    table = learning.table().to_markdown(index=False, floatfmt=FLOAT, missingval="n/a")
    lines += [table, ""]
    if image is not None:
        lines += [f"![{card.id}: learning curves]({image})", ""]
    elif learning.bug.trained:
        lines += [prose(f"No picture: buggy.py {d.label}, along fixed.py's curve."), ""]
    return [*lines, LEARNING_END]


def findings_note(rows: list[tuple[Card, Verdict, Learning]]) -> str:
    """Under the summary: the traps whose learning and one-pass verdict disagree."""
    normal = [(c.id, lr.diagnosis) for c, v, lr in rows if v is Verdict.SILENT]
    idle = [t for t, d in normal if d.kind == LEARNS and d.identical]
    silent = [t for t, d in normal if d.kind == LEARNS and not d.identical]
    benign = [
        c.id for c, v, lr in rows
        if v is Verdict.BENIGN and lr.diagnosis.kind not in (LEARNS, NO_BASELINE, MIXED)
    ]  # fmt: skip
    untrained = [c.id for c, _, lr in rows if lr.diagnosis.kind == NO_BASELINE]
    parts = []
    if idle:
        parts.append(f"SILENT by one pass, yet training identically on these tasks: {ids(idle)}")
    if silent:
        parts.append(
            "SILENT by one pass, yet learning normally on these tasks: "
            + ", ".join(f"`{t}`" for t in silent)
            + " (their sections say where the harm is instead)"
        )
    if benign:
        parts.append(
            "BENIGN by one pass, yet learning differently: " + ", ".join(f"`{t}`" for t in benign)
        )
    if untrained:
        parts.append(
            "no conclusion, as fixed.py does not learn the task: "
            + ", ".join(f"`{t}`" for t in untrained)
        )
    if not parts:
        return f"{LEARNING_AGREES}: no SILENT trap trains normally here."
    return LEARNING_DISAGREES + "; ".join(parts) + "."


def ids(traps: list[str]) -> str:
    return ", ".join(f"`{t}`" for t in traps)
