"""The learning probe: train an attention module inside a tiny model on a task that needs it.

One forward and backward pass says how far a buggy module is from a fixed one; it does not say
whether the bug stops a model from learning. This module trains. The model is as small as a model
with attention can be: a token embedding plus an embedding of the token before it (so that one
attention layer can find "the position after the one that matched", an induction step), the
attention module, and a linear read-out to the vocabulary. No residual path: every answer has to
come through attention.

Two tasks, both solvable only by looking at other positions:

- ``recall`` (bidirectional): key-value pairs, then queries ``? k``; the answer at each query is
  the value stored under ``k``. With ``padded`` some rows hold fewer pairs and padding after them.
- ``copy`` (causal): a prompt of distinct tokens, then the prompt again; from the second copy on
  each next token is predicted by finding where the current token appeared before. ``period`` is
  the prompt length (a sliding window needs it short), ``left_pad`` pads rows on the left, as a
  batch is padded for generation, and ``packed`` puts two documents in each row, positions
  restarting at the second.

A run trains for ``STEPS`` steps of seeded batches and records loss and answer accuracy per step
(each step's batch is new, so its accuracy, taken before the update, is a held-out one). Causal
modules are then evaluated twice on a fixed batch: teacher-forced (the whole sequence in one call,
as in training) and by generation (each answer from the tokens before it only, through the
module's own cache where it has one). A module that reads the answer from the future is perfect
the first way and lost the second.

``diagnose`` names what a bug does to learning by comparing the buggy run with the fixed one.
Everything is seeded and runs on one thread (tiny tensors are fastest there), so the same call
gives the same numbers on the same machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import lru_cache

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from harness.defaults import LEARN_STEPS
from harness.inputs import generator
from harness.runner import describe, split_output
from harness.scenarios import lay_out
from harness.tally import Tally, agreed

VOCAB = 16  # token ids 0..15
SEQ_LEN = 16
D_MODEL = 32
BATCH = 32
EVAL_BATCH = 256  # the fixed batch a trained model is evaluated on
EVAL_STEP = 99_991  # its batch is drawn as this step's (step_seed)
STEPS = LEARN_STEPS  # named in harness.defaults: the command line shows it
LR = 2e-2
THRESHOLD = 0.9  # answer accuracy that counts as "learned"
SMOOTH = 10  # steps to threshold: the first step whose mean accuracy over this many reaches it
SLOWER = 1.5  # a bug that needs this many times the fixed steps (or more) learns slower
FASTER = 1 / SLOWER
FLAT_GAIN = 0.15  # a run whose accuracy rose by less than this did not learn
ENDS_BELOW = (
    0.05  # ending this far below fixed.py's accuracy is learning slower, whatever the ratio
)
GAP = 0.1  # teacher-forced accuracy this far above generation accuracy: it read the future
WORSE = 0.03  # eval mode loses this much more accuracy (against training's) than fixed.py's
EMBED_STD = 0.5**0.5
IGNORE = -100  # target of a position that is not scored

# recall: keys 0..7, values 8..14, 15 marks a query (and pads)
KEYS, VALUES, MARK = 8, 7, 15
PAIRS, QUERIES = 6, 2


@dataclass(frozen=True)
class Batch:
    """One batch of a task: tokens, what to predict where, and which keys each query may see."""

    tokens: Tensor  # (B, T) int64
    targets: Tensor  # (B, T) int64: the next token (copy) or the value (recall); else IGNORE
    answers: Tensor  # (B, T) bool: the targets a model can know: trained and scored
    keep: Tensor | None  # (B, T, T) bool, True = may attend; None: no mask
    positions: Tensor | None = None  # (B, T) int64; None: the module's own
    unknowable: Tensor | None = None  # (B, T) bool: targets no causal model can know

    def prefix(self, length: int) -> Batch:
        """The first ``length`` tokens, as generation sees them."""
        keep = None if self.keep is None else self.keep[:, :length, :length]
        positions = None if self.positions is None else self.positions[:, :length]
        unknowable = None if self.unknowable is None else self.unknowable[:, :length]
        cut = self.tokens[:, :length], self.targets[:, :length], self.answers[:, :length]
        return Batch(*cut, keep, positions, unknowable)


@dataclass(frozen=True)
class Task:
    """A synthetic task attention is needed for."""

    name: str  # "recall" or "copy"
    period: int = SEQ_LEN // 2  # copy: the prompt's length
    padded: bool = False  # recall: some rows are shorter, padded on the right
    left_pad: bool = False  # copy: some rows are padded on the left
    packed: bool = False  # copy: two documents per row, positions restarting
    seq_len: int = SEQ_LEN

    def __post_init__(self) -> None:
        if self.name not in ("recall", "copy"):
            raise ValueError(f"unknown task {self.name!r}")
        if not 3 <= self.period <= self.seq_len // 2:
            raise ValueError(f"period {self.period} not in 3..{self.seq_len // 2}")

    @property
    def causal(self) -> bool:
        return self.name == "copy"

    def describe(self) -> str:
        """One line for tables and the report."""
        if self.name == "recall":
            text = f"associative recall: {PAIRS} key-value pairs, then {QUERIES} queries"
            return text + (", some rows padded" if self.padded else "")
        text = f"copy: a prompt of {self.period} distinct tokens, repeated"
        if self.left_pad:
            text += ", some rows left-padded"
        if self.packed:
            text += ", two documents per row"
        return text

    def draw(self, batch: int, gen: torch.Generator) -> Batch:
        """A seeded batch."""
        return (
            recall_batch(self, batch, gen)
            if self.name == "recall"
            else copy_batch(self, batch, gen)
        )


def distinct(batch: int, n: int, high: int, gen: torch.Generator) -> Tensor:
    """(B, n) rows of n distinct tokens from 0..high-1."""
    return torch.rand(batch, high, generator=gen).argsort(dim=-1)[:, :n]


def recall_batch(task: Task, batch: int, gen: torch.Generator) -> Batch:
    """``k1 v1 ... kn vn ? q1 ? q2`` (padding after the pairs in shorter rows); answers at q."""
    keys = distinct(batch, PAIRS, KEYS, gen)  # (B, n)
    values = torch.randint(KEYS, KEYS + VALUES, (batch, PAIRS), generator=gen)  # (B, n)
    n_pairs = torch.full((batch,), PAIRS)
    if task.padded:
        n_pairs = torch.randint(QUERIES, PAIRS + 1, (batch,), generator=gen)
        n_pairs[0] = PAIRS  # one full row in every batch
    order = torch.rand(batch, PAIRS, generator=gen).masked_fill(
        torch.arange(PAIRS) >= n_pairs[:, None], 2.0
    )
    asked = order.argsort(dim=-1)[:, :QUERIES]  # (B, QUERIES): distinct pairs among the real ones
    pairs = torch.stack([keys, values], dim=-1).reshape(batch, 2 * PAIRS)  # (B, 2n)
    queries = torch.stack([torch.full_like(asked, MARK), keys.gather(1, asked)], dim=-1)
    body = torch.arange(2 * PAIRS) < 2 * n_pairs[:, None]  # (B, 2n): real pairs
    pairs = pairs.masked_fill(~body, MARK)
    tokens = torch.cat([pairs, queries.reshape(batch, 2 * QUERIES)], dim=1)  # (B, T)
    tokens = pad_to(tokens, task.seq_len, MARK)
    targets = torch.full_like(tokens, IGNORE)
    answer_at = 2 * PAIRS + 1 + 2 * torch.arange(QUERIES)  # the query keys' positions
    targets[:, answer_at] = values.gather(1, asked)
    keep = None
    if task.padded:
        real = torch.cat([body, torch.ones(batch, tokens.size(1) - 2 * PAIRS, dtype=torch.bool)], 1)
        real[:, 2 * PAIRS + 2 * QUERIES :] = False
        keep = real[:, None, :].expand(batch, tokens.size(1), tokens.size(1)).clone()  # (B, T, T)
    return Batch(tokens, targets, targets != IGNORE, keep)


def pad_to(tokens: Tensor, length: int, pad: int) -> Tensor:
    """``tokens`` (B, n) padded on the right with ``pad`` to ``length``."""
    if tokens.size(1) > length:
        raise ValueError(f"the task needs {tokens.size(1)} positions, more than {length}")
    return F.pad(tokens, (0, length - tokens.size(1)), value=pad)


def copy_batch(task: Task, batch: int, gen: torch.Generator) -> Batch:
    """A prompt of ``period`` distinct tokens repeated to the end of the row. Every next token
    is a target. From the second copy on it can be known from the tokens before it: the
    answers, which are trained and scored. Within the prompt it cannot: a module that predicts
    those (the unknowable targets) reads the future. (The prompt's last token, followed by the
    first again, is neither: a module with positions can know it.) Left padding and packing as
    ``task`` says."""
    T, P = task.seq_len, task.period
    tokens = distinct(batch, P, VOCAB, gen).repeat(1, T // P + 1)[:, :T]  # (B, T)
    targets = torch.full_like(tokens, IGNORE)
    targets[:, :-1] = tokens[:, 1:]
    position = torch.arange(T).expand(batch, T)  # (B, T)
    causal = torch.ones(T, T, dtype=torch.bool).tril().expand(batch, T, T)  # (B, T, T)
    if task.packed:
        return packed(tokens, P, gen)
    answers, unknowable = (position >= P) & (position < T - 1), position < P - 1
    if not task.left_pad:
        return Batch(tokens, targets, answers, causal.clone(), None, unknowable)
    pads = torch.randint(0, T - 2 * P, (batch,), generator=gen)  # room for two copies
    pads[0] = 0
    real = torch.arange(T) >= pads[:, None]  # (B, T)
    tokens, targets, answers, unknowable = (
        torch.stack([row.roll(int(p)) for row, p in zip(rows, pads, strict=True)])
        for rows in (tokens, targets, answers, unknowable)
    )
    tokens, targets = tokens.masked_fill(~real, 0), targets.masked_fill(~real, IGNORE)
    keep = causal & real[:, None, :] & real[:, :, None]  # (B, T, T)
    return Batch(tokens, targets, answers & real, keep, None, unknowable & real)


def packed(tokens: Tensor, period: int, gen: torch.Generator) -> Batch:
    """Two documents per row: the second, with a prompt of its own, starts at a drawn position
    (room for two copies in each); positions restart there. The first document's last token
    has no target: the next document cannot be known from it."""
    batch, T = tokens.shape
    starts = torch.randint(2 * period + 1, T - 2 * period + 1, (batch,), generator=gen)  # (B,)
    second = distinct(batch, period, VOCAB, gen).repeat(1, T // period + 2)  # (B, > T)
    arange = torch.arange(T).expand(batch, T)  # (B, T)
    in_second = arange >= starts[:, None]  # (B, T)
    position = torch.where(in_second, arange - starts[:, None], arange)  # (B, T)
    tokens = torch.where(in_second, second.gather(1, position), tokens)
    targets = torch.full_like(tokens, IGNORE)
    targets[:, :-1] = tokens[:, 1:]
    targets = targets.masked_fill(arange == starts[:, None] - 1, IGNORE)
    answers = (position >= period) & (targets != IGNORE)  # (B, T): the copies
    unknowable = (position < period - 1) & (targets != IGNORE)  # (B, T): within a prompt
    causal = torch.ones(T, T, dtype=torch.bool).tril().expand(batch, T, T).clone()
    return Batch(tokens, targets, answers, causal, position, unknowable)


# How one teacher-forced call reaches the attention module: (module, x, batch) -> forward's
# return; x is the embedded (B, T, D_MODEL) batch.
Attend = Callable[[nn.Module, Tensor, Batch], object]
# How generation reaches it: (module, x, batch) -> (B, T, d) outputs, each position computed
# from the positions before it only, and the weights of those calls laid out as (..., T, T)
# (None when the module returns none).
Generate = Callable[[nn.Module, Tensor, Batch], tuple[Tensor, Tensor | None]]


class TinyModel(nn.Module):
    """Token and previous-token embeddings, the attention module, a linear read-out."""

    def __init__(self, attention: nn.Module, d_out: int, d_model: int = D_MODEL) -> None:
        super().__init__()
        self.token = nn.Embedding(VOCAB, d_model)
        self.previous = nn.Embedding(VOCAB + 1, d_model)  # VOCAB: no token before the first
        self.attention = attention
        self.readout = nn.Linear(d_out, VOCAB)
        for table in (self.token, self.previous):  # their sum x has unit variance, as the
            nn.init.normal_(table.weight, std=EMBED_STD)  # catalogue's inputs do

    def embed(self, tokens: Tensor) -> Tensor:
        """(B, T) tokens -> (B, T, d_model): each position's token and the one before it."""
        first = torch.full_like(tokens[:, :1], VOCAB)
        before = torch.cat([first, tokens[:, :-1]], dim=1)  # (B, T)
        return self.token(tokens) + self.previous(before)

    def forward(self, batch: Batch, attend: Attend) -> tuple[Tensor, Tensor | None]:
        """Logits (B, T, VOCAB) and the attention weights the module returns."""
        out, weights = split_output(attend(self.attention, self.embed(batch.tokens), batch))
        return self.readout(out), weights


@dataclass
class Run:
    """One module's training: its curve and its evaluation."""

    curve: pd.DataFrame  # step, loss, accuracy
    error: str | None = None  # what training raised
    eval_error: str | None = None  # what evaluation (or generation) raised
    # On the fixed batch in eval mode: accuracy on the answers, teacher-forced and (causal
    # tasks) by generation; and on the targets no causal model can know (a copy's prompt).
    eval_accuracy: float = math.nan
    generation_accuracy: float | None = None
    unknowable_accuracy: float | None = None
    unknowable_by_generation: float | None = None
    attention: Tensor | None = None  # (T, T) weights on the fixed batch's row 0, heads averaged
    attention_blocked: Tensor | None = None  # (T, T) bool: the keys row 0 must not see
    generation_attention: Tensor | None = None  # (T, T) the same row's weights by generation

    @property
    def trained(self) -> bool:
        return self.error is None and len(self.curve) > 0

    @property
    def steps_to_threshold(self) -> int | None:
        """The first step whose mean accuracy over the last ``SMOOTH`` steps reaches THRESHOLD."""
        if not self.trained:
            return None
        smooth = self.curve["accuracy"].rolling(SMOOTH, min_periods=SMOOTH).mean()
        reached = self.curve["step"][smooth >= THRESHOLD]
        return int(reached.iloc[0]) if len(reached) else None

    @property
    def nonfinite_step(self) -> int | None:
        """The first step whose loss is NaN or Inf."""
        if not self.trained:
            return None
        bad = self.curve["step"][~self.curve["loss"].map(math.isfinite)]
        return int(bad.iloc[0]) if len(bad) else None

    def loss_at(self, start: bool) -> float:
        """Mean loss over the first (``start``) or last SMOOTH steps."""
        return self._mean("loss", start)

    def accuracy_at(self, start: bool) -> float:
        """Mean answer accuracy over the first (``start``) or last SMOOTH steps."""
        return self._mean("accuracy", start)

    def _mean(self, column: str, start: bool) -> float:
        values = self.curve[column].head(SMOOTH) if start else self.curve[column].tail(SMOOTH)
        if not values.map(math.isfinite).all():
            return math.nan  # a run that turned NaN has no mean to speak of
        return float(values.mean())


@contextmanager
def one_thread() -> Iterator[None]:
    """Run on one intra-op thread (tiny tensors are fastest there), then restore the setting."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def answer_loss(logits: Tensor, batch: Batch) -> Tensor:
    """Cross-entropy on the answers only: what can be learned (a copy's prompt cannot)."""
    answers_only = batch.targets.masked_fill(~batch.answers, IGNORE)  # what can be learned
    return F.cross_entropy(logits.flatten(0, 1), answers_only.flatten(), ignore_index=IGNORE)


def accuracy(logits: Tensor, targets: Tensor, where: Tensor) -> float:
    """Fraction of the positions ``where`` whose most likely token is the target."""
    return accuracies(logits[None], targets[None], where[None])[0]


def accuracies(logits: Tensor, targets: Tensor, where: Tensor) -> list[float]:
    """``accuracy`` of each of several runs at once (logits (S, B, T, V)), counted, so exact;
    NaN for a run with no position ``where``. (``max`` picks the first of equal logits, as
    ``argmax`` does, in half its time on a short last axis.)"""
    hits = ((logits.max(-1).indices == targets) & where).sum(dim=(1, 2)).tolist()
    counts = where.sum(dim=(1, 2)).tolist()
    return [h / n if n else math.nan for h, n in zip(hits, counts, strict=True)]


def head_mean(weights: Tensor | None, row: int = 0) -> Tensor | None:
    """Row ``row``'s (T, S) weights, averaged over heads when there are several."""
    if weights is None or weights.dim() < 3:
        return None
    picked = weights[row].detach().float()
    return picked.mean(0) if picked.dim() == 3 else picked


def train(
    model: TinyModel,
    task: Task,
    attend: Attend,
    seed: int,
    steps: int = STEPS,
    device: torch.device | None = None,
) -> Run:
    """Train ``model`` with Adam on ``steps`` seeded batches; the curve of loss and accuracy.

    The batches depend on ``seed`` and the step only, so two models trained with the same seed
    see the same data; dropout draws from the global generator, seeded here with ``seed``.
    A forward that raises or a NaN loss ends the run; the curve keeps the steps before it.
    """
    device = device or torch.device("cpu")
    model.to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, foreach=True)
    torch.manual_seed(seed)
    rows = []
    for step in range(1, steps + 1):  # step s: the s-th batch, before its update
        batch = on(seeded_batch(task, BATCH, step_seed(seed, step)), device)
        try:
            logits, _ = model(batch, attend)
        except Exception as error:  # the buggy module may raise: that is the finding
            return Run(pd.DataFrame(rows, columns=["step", "loss", "accuracy"]), describe(error))
        loss = answer_loss(logits, batch)
        rows.append((step, loss.item(), accuracy(logits, batch.targets, batch.answers)))
        if not math.isfinite(rows[-1][1]):
            break
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return Run(pd.DataFrame(rows, columns=["step", "loss", "accuracy"]))


def step_seed(seed: int, step: int) -> int:
    """The generator seed of run ``seed``'s batch at ``step`` (the evaluation's: ``EVAL_STEP``)."""
    return seed * 100_003 + step


@lru_cache(maxsize=2 * STEPS)
def seeded_batch(task: Task, size: int, seed: int) -> Batch:
    """``task``'s batch of ``size`` rows drawn with ``generator(seed)``; the last few hundred
    kept, since the fixed and the buggy run (and the next trap's, on the same task) train on the
    same batches. Not to be changed in place."""
    return task.draw(size, generator(seed))


def on(batch: Batch, device: torch.device) -> Batch:
    """``batch`` with every tensor on ``device``."""
    moved = {
        name: None if value is None else value.to(device) for name, value in vars(batch).items()
    }
    return replace(batch, **moved)


def evaluate(
    run: Run,
    model: TinyModel,
    task: Task,
    attend: Attend,
    generate: Generate | None,
    seed: int,
    device: torch.device | None = None,
) -> Run:
    """``run`` with its evaluation on a fixed batch in eval mode: teacher-forced accuracy, the
    attention map of its first row, and (``generate``) accuracy by generation. A module that
    draws random numbers in eval mode (a dropout left on) draws them from the global generator
    seeded for this evaluation, so what it answers depends on ``seed`` alone, not on what the
    process ran before."""
    if not run.trained or run.nonfinite_step is not None:
        return run  # a NaN model answers nothing: its accuracies stay NaN
    device = device or torch.device("cpu")
    batch = on(seeded_batch(task, EVAL_BATCH, step_seed(seed, EVAL_STEP)), device)
    model.eval()
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(step_seed(seed, EVAL_STEP))
        try:
            logits, weights = model(batch, attend)
            if generate is not None:
                x = model.embed(batch.tokens)  # (B, T, d_model)
                outputs, generated_weights = generate(model.attention, x, batch)
                generated = model.readout(outputs)
        except Exception as error:
            return replace(run, eval_error=describe(error))
    run = replace(
        run,
        eval_accuracy=accuracy(logits, batch.targets, batch.answers),
        attention=head_mean(weights),
        attention_blocked=None if batch.keep is None else ~batch.keep[0].cpu(),
    )
    if generate is None or batch.unknowable is None:
        return run
    return replace(
        run,
        generation_accuracy=accuracy(generated, batch.targets, batch.answers),
        unknowable_accuracy=accuracy(logits, batch.targets, batch.unknowable),
        unknowable_by_generation=accuracy(generated, batch.targets, batch.unknowable),
        generation_attention=head_mean(generated_weights),
    )


def prefix_generation(attend: Attend) -> Generate:
    """Generation for a module without a cache: position t is computed from a call on the first
    t + 1 tokens alone, as a model without a cache generates."""

    def generate(module: nn.Module, x: Tensor, batch: Batch) -> tuple[Tensor, Tensor | None]:
        outputs, rows = [], []
        for t in range(x.size(1)):
            out, w = split_output(attend(module, x[:, : t + 1], batch.prefix(t + 1)))
            outputs.append(out[:, -1:])
            rows.append((t, t + 1, None if w is None else w[..., -1:, :]))
        return torch.cat(outputs, dim=1), lay_out(rows, x.size(1))  # (B, T, d), (..., T, T)

    return generate


# What a bug does to learning, from its run against the fixed module's.
LEARNS = "learns normally"
FASTER_LABEL = "learns faster"
SLOWER_LABEL = "learns slower"
FLAT_LABEL = "does not learn"
NAN = "diverges or NaN"
TOO_GOOD = "too good to be true"
GENERATION = "wrong in generation"
EVALUATION = "worse in evaluation"
RAISES = "raises"
NO_BASELINE = "no conclusion: fixed.py does not learn this task"
SAME_RUN = 1e-6  # loss curves this close (relative) are one run: the bug never fired


@dataclass(frozen=True)
class Diagnosis:
    """What the bug does to learning on one seed: a label and the numbers behind it."""

    label: str
    evidence: str
    ratio: float | None = None  # steps to threshold, buggy / fixed
    identical: bool = False  # both modules trained alike to the last digit

    @property
    def kind(self) -> str:
        """The label without its numbers: "learns slower", "wrong in generation", ..."""
        return self.label.split(" (")[0]


IDENTICAL = "identical training"


@dataclass(frozen=True)
class Claim:
    """What the bug does to learning over a fixed set of seeds: each seed's outcome tallied,
    the outcome claimed when enough agree (``harness.tally``), and one seed's numbers as
    evidence (the first seed that gives the claim)."""

    seeds: tuple[Diagnosis, ...]
    first_seed: int

    @property
    def tally(self) -> Tally:
        return Tally.of(d.kind for d in self.seeds)

    @property
    def shown(self) -> int:
        """The index of the seed whose numbers are shown: the first that gives the claim."""
        claim = self.tally.claim
        return next((i for i, d in enumerate(self.seeds) if d.kind == claim), 0)

    @property
    def label(self) -> str:
        """The tally, claim first: ``does not learn 5/5``, ``mixed: ...``."""
        return self.tally.text()

    @property
    def kind(self) -> str:
        """The claimed kind ("learns slower", ...), or ``MIXED``."""
        return self.tally.claim

    @property
    def identical(self) -> bool:
        """Whether every seed trained both modules alike: the bug never fired."""
        return all(d.identical for d in self.seeds)

    @property
    def evidence(self) -> str:
        """The shown seed's label and evidence."""
        d = self.seeds[self.shown]
        return f"seed {self.first_seed + self.shown}: {d.label}; {d.evidence}"

    @property
    def ratio(self) -> float | None:
        return self.seeds[self.shown].ratio

    def supports(self, kinds: tuple[str, ...]) -> bool:
        """Whether enough seeds (as for a claim) give one of ``kinds``."""
        return agreed(sum(d.kind in kinds for d in self.seeds), len(self.seeds))


def diagnose(fix: Run, bug: Run) -> Diagnosis:
    """Name the bug's effect on learning, by comparing its run with the fixed one.

    In order: a bug that raises, or whose loss turns NaN; then the fixed module must learn
    (else nothing more can be said); a bug that predicts what no causal model can know (too
    good to be true); one right teacher-forced and wrong by generation; one that never reaches
    the threshold (flat when its accuracy rose by less than FLAT_GAIN); one that loses more in
    eval mode than fixed.py does; then the ratio of steps to threshold (slower, too, when it
    ends ENDS_BELOW under fixed.py's accuracy).
    """
    if not bug.trained:
        return Diagnosis(RAISES, bug.error or "no step ran")
    if (step := bug.nonfinite_step) is not None:
        value = bug.curve["loss"][bug.curve["step"] == step].iloc[0]
        return Diagnosis(NAN, f"the loss is {value} at step {step}; training stops there")
    if bug.eval_error is not None:
        return Diagnosis(RAISES, f"in evaluation: {bug.eval_error}")
    if not fix.trained or fix.eval_error or fix.steps_to_threshold is None:
        reached = f"it does not reach {THRESHOLD:.0%} in {plural(len(fix.curve), 'step')}"
        return Diagnosis(NO_BASELINE, fix.error or fix.eval_error or reached)
    fixed_steps, steps = fix.steps_to_threshold, bug.steps_to_threshold
    ratio = None if steps is None else steps / fixed_steps
    if leak := reads_the_future(bug, fix):
        return Diagnosis(TOO_GOOD, leak, ratio)
    if gap := generation_gap(bug, fix):
        return Diagnosis(GENERATION, gap, ratio)
    fixed = f"fixed.py: {plural(fixed_steps, 'step')} to {THRESHOLD:.0%}"
    if steps is None:
        first, last = bug.accuracy_at(start=True), bug.accuracy_at(start=False)
        moved = f"accuracy {first:.2f} → {last:.2f} over {plural(len(bug.curve), 'step')}"
        if last - first < FLAT_GAIN:
            return Diagnosis(FLAT_LABEL, f"{moved}, a rise under {FLAT_GAIN:g} ({fixed})")
        bound = len(bug.curve) / fixed_steps
        never = f"{moved}, never {THRESHOLD:.0%} ({fixed})"
        return Diagnosis(f"{SLOWER_LABEL} (never {THRESHOLD:.0%}: ×>{bound:.3g})", never, bound)
    final = bug.accuracy_at(start=False), fix.accuracy_at(start=False)
    versus = f"{plural(steps, 'step')} to {THRESHOLD:.0%} against {fixed_steps}; " + (
        f"accuracy over the last {SMOOTH} steps {final[0]:.3f} against {final[1]:.3f}"
    )
    if eval_loss(bug) - eval_loss(fix) >= WORSE:
        evaluated = (
            f"in eval mode {bug.eval_accuracy:.3f} against fixed.py's {fix.eval_accuracy:.3f}, "
            f"where its last training steps had {final[0]:.3f} against {final[1]:.3f}"
        )
        return Diagnosis(EVALUATION, f"{evaluated}; {plural(steps, 'step')} to 90%", ratio)
    if ratio >= SLOWER:
        return Diagnosis(f"{SLOWER_LABEL} (×{ratio:.3g})", versus, ratio)
    if final[1] - final[0] >= ENDS_BELOW:
        below = f"{SLOWER_LABEL} (×{ratio:.3g}, ends {final[1] - final[0]:.2f} lower)"
        return Diagnosis(below, versus, ratio)
    if ratio <= FASTER:
        return Diagnosis(f"{FASTER_LABEL} (×{ratio:.3g})", versus, ratio)
    if same_run(fix, bug):
        same = "identical training: the bug does not touch a full forward on this task"
        if bug.generation_accuracy is not None and fix.generation_accuracy is not None:
            same += (
                f"; by generation {bug.generation_accuracy:.1%} of the answers against "
                f"{fix.generation_accuracy:.1%}"
            )
        return Diagnosis(f"{LEARNS} ({IDENTICAL})", same, 1.0, True)
    return Diagnosis(f"{LEARNS} (×{ratio:.3g})", versus, ratio)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def eval_loss(run: Run) -> float:
    """How much accuracy a run loses in eval mode against its last training steps."""
    return run.accuracy_at(start=False) - run.eval_accuracy


def same_run(fix: Run, bug: Run) -> bool:
    """Whether the two curves (loss and accuracy) agree to SAME_RUN, relative: one run, the
    bug idle."""
    if len(fix.curve) != len(bug.curve):
        return False
    for column in ("loss", "accuracy"):
        a, b = fix.curve[column], bug.curve[column]
        if not ((a - b).abs() <= SAME_RUN * a.abs().max()).all():
            return False
    return True


def reads_the_future(bug: Run, fix: Run) -> str | None:
    """Evidence that the bug predicts, teacher-forced, tokens no causal model can know, and
    loses them by generation."""
    if bug.unknowable_accuracy is None or fix.unknowable_accuracy is None:
        return None
    assert bug.unknowable_by_generation is not None
    if bug.unknowable_accuracy - fix.unknowable_accuracy < GAP:
        return None
    if bug.unknowable_accuracy - bug.unknowable_by_generation < GAP:
        return None
    answers = (
        f"its answers: {bug.eval_accuracy:.0%} teacher-forced, {bug.generation_accuracy:.0%} by "
        "generation"
    )
    if bug.eval_accuracy - bug.generation_accuracy < GAP:  # type: ignore[operator]
        answers += " (here the copy can also be found from the tokens before: it survives)"
    return (
        f"teacher-forced it predicts {bug.unknowable_accuracy:.0%} of the prompt's next tokens, "
        f"which no causal model can know (fixed.py: {fix.unknowable_accuracy:.0%}); by "
        f"generation, where the future is not there, {bug.unknowable_by_generation:.0%} of them; "
        + answers
    )


def generation_gap(bug: Run, fix: Run) -> str | None:
    """Evidence that the bug answers right teacher-forced and wrong by generation, where the
    fixed module answers alike both ways."""
    if bug.generation_accuracy is None or fix.generation_accuracy is None:
        return None
    bug_gap = bug.eval_accuracy - bug.generation_accuracy
    fix_gap = fix.eval_accuracy - fix.generation_accuracy
    if bug_gap < GAP or fix_gap >= GAP:
        return None
    return (
        f"answers {bug.eval_accuracy:.0%} right teacher-forced, {bug.generation_accuracy:.0%} "
        f"by generation (fixed.py: {fix.eval_accuracy:.0%}, {fix.generation_accuracy:.0%})"
    )


@dataclass
class Learning:
    """A pair's learning probe: the task, what the bug does over the seeds, and both runs of
    the seed shown (the first that gives the claim: ``diagnosis.shown``)."""

    task: Task
    fix: Run
    bug: Run
    diagnosis: Claim
    note: str = ""  # what the probe cannot show for this trap (a numeric or shape-only harm)

    def curves(self) -> pd.DataFrame:
        """Loss and accuracy per step, fixed beside buggy (NaN after a run ended)."""
        fix = self.fix.curve.set_index("step").add_prefix("fixed.py ")
        bug = self.bug.curve.set_index("step").add_prefix("buggy.py ")
        return fix.join(bug, how="outer").reset_index()

    def table(self) -> pd.DataFrame:
        """One row per module: steps to threshold, mean loss over the first and last SMOOTH
        steps, and accuracies on the fixed batch in eval mode: the answers teacher-forced and
        (causal tasks) by generation, and the prompt's tokens no causal model can know."""
        rows = []
        for name, run in (("fixed.py", self.fix), ("buggy.py", self.bug)):
            rows.append(
                {
                    "module": name,
                    f"steps to {THRESHOLD:.0%}": run.steps_to_threshold,
                    "loss, first 10": run.loss_at(start=True) if run.trained else math.nan,
                    "loss, last 10": run.loss_at(start=False) if run.trained else math.nan,
                    "accuracy, last 10": run.accuracy_at(start=False) if run.trained else math.nan,
                    "teacher-forced": run.eval_accuracy,
                    "by generation": run.generation_accuracy,
                    "unknowable, teacher-forced": run.unknowable_accuracy,
                    "unknowable, by generation": run.unknowable_by_generation,
                    "raised": run.error or run.eval_error or "",
                }
            )
        df = pd.DataFrame(rows)
        if not self.task.causal:
            unknowable = ["unknowable, teacher-forced", "unknowable, by generation"]
            df = df.drop(columns=["by generation", *unknowable])
        if not df["raised"].any():
            df = df.drop(columns="raised")
        return df.astype(object).where(df.notna(), None)  # missing (not measured): None
