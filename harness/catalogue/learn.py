"""The learning probe on a catalogue pair: train fixed.py and buggy.py from the same weights on
the same batches (harness.learning) and name what the bug does to learning.

The task follows the card: bidirectional modules learn associative recall (with padded rows when
the card's mask is padding); causal ones learn to copy, with left-padded rows, two packed
documents per row, or a prompt short enough for a sliding window where the card needs them.
Causal modules are also evaluated by generation: through the file's own ``KVCache`` in the
card's cached scenario (decoding, when the card measures the full forward), or, for a module
without a cache, by calling it on each prefix.

Every trap is trained on the same ``SEEDS`` seeds (all at once where ``harness.vectorized`` can)
and what the bug does is stated as their tally (``harness.tally``): a single run's label is a
property of one CPU's rounding, not of the trap.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import sys

import torch
from torch import Tensor, nn

from harness.catalogue.card import Card, Pair
from harness.catalogue.compare import build_pair
from harness.catalogue.verdicts import Verdict
from harness.learning import (
    BATCH,
    D_MODEL,
    SEQ_LEN,
    STEPS,
    Attend,
    Batch,
    Claim,
    Generate,
    Learning,
    Run,
    Task,
    TinyModel,
    diagnose,
    evaluate,
    one_thread,
    prefix_generation,
)
from harness.masks import CAUSAL_KINDS
from harness.runner import seeded, split_output
from harness.scenarios import SCENARIOS, make_call
from harness.shapes import Shape
from harness.tally import SEEDS
from harness.vectorized import train_seeds

SINGLE_HEAD_WIDTH = 8  # d_k = d_v of a single-head module (not T, which would trigger v_layout)
PACKED_PERIOD = 3  # room for two documents of two copies each in SEQ_LEN tokens
LEFT_PAD_PERIOD = 4  # room for up to SEQ_LEN - 8 padding tokens


def learning_shape(card: Card) -> Shape:
    """The card's head count at the probe's sizes."""
    heads = card.shape.heads
    width = SINGLE_HEAD_WIDTH if heads == 1 else D_MODEL // heads
    return Shape(batch=BATCH, seq_len=SEQ_LEN, d_model=D_MODEL, d_k=width, d_v=width, heads=heads)


def task_for(card: Card, fixed: nn.Module) -> Task:
    """The task the card's modules can be trained on: recall for bidirectional ones, copying
    for causal ones (a prompt as short as a sliding window, packed or left-padded rows)."""
    if card.mask not in CAUSAL_KINDS:
        return Task("recall", padded=card.mask == "padding")
    window = getattr(fixed, "window", None)
    if isinstance(window, int):
        return Task("copy", period=window)
    if card.how.positions == "packed":
        return Task("copy", period=PACKED_PERIOD, packed=True)
    if card.mask == "left_padding":
        return Task("copy", period=LEFT_PAD_PERIOD, left_pad=True)
    return Task("copy")


def attend_for(card: Card) -> Attend:
    """One teacher-forced call: the whole sequence, the mask in the card's convention."""

    def attend(module: nn.Module, x: Tensor, batch: Batch) -> object:
        keep = None if card.mask == "none" else batch.keep
        return make_call(SCENARIOS["full"], keep, card.spec, batch.positions, None)(module, x)

    return attend


def generate_for(card: Card, attend: Attend) -> Generate:
    """Generation as each module's file allows: through its own ``KVCache`` (the card's cached
    scenario, else decoding), or on each prefix when it has none."""
    scenario = card.how if card.how.cached else SCENARIOS["decode"]

    def generate(module: nn.Module, x: Tensor, batch: Batch) -> tuple[Tensor, Tensor | None]:
        new_cache = getattr(sys.modules[type(module).__module__], "KVCache", None)
        if new_cache is None:
            return prefix_generation(attend)(module, x, batch)
        call = make_call(scenario, batch.keep, card.spec, batch.positions, new_cache)
        return call(module, x)

    return generate


def note_for(card: Card, learning: Learning) -> str:
    """What a float32 run on ordinary inputs cannot show for this trap."""
    if card.expected is Verdict.NUMERIC:
        return (
            "A NUMERIC trap: its harm needs low precision or edge inputs (see its verdicts); "
            "this run trains in float32 on ordinary inputs, where it does not bite."
        )
    if card.expected is Verdict.CONDITIONAL and learning.bug.error:
        return (
            "A CONDITIONAL trap: it raises at these sizes, so a model with it crashes unless its "
            "shapes happen to be the trigger shapes the catalogue finds, where it runs silently."
        )
    if not card.shared_weights:
        return "The bug is the initialisation: each module starts from its own init."
    return ""


def output_width(module: nn.Module, task: Task, attend: Attend) -> int:
    """The width of what the module returns on one example of the task."""
    batch = task.draw(1, torch.Generator().manual_seed(0))
    x = torch.zeros(1, batch.tokens.size(1), D_MODEL)
    with torch.no_grad():
        out, _ = split_output(attend(module, x, batch))
    return out.size(-1)


# fixed.py's trained and evaluated runs, one per seed, by ``fixed_key``: shared by the pairs
# whose fixed.py trains alike
FixedRuns = dict[str, list[Run]]


def learn(
    pair: Pair,
    seed: int = 0,
    device: torch.device | None = None,
    steps: int = STEPS,
    trained: FixedRuns | None = None,
) -> Learning:
    """Train both modules of ``pair`` (same initial weights, same batches) on each of the
    ``SEEDS`` seeds from ``seed`` on, and tally what the bug does over them. fixed.py's runs
    are taken from ``trained`` where a pair whose fixed.py trains alike left them, and left
    there for the next."""
    device = device or torch.device("cpu")
    card = pair.card
    attend = attend_for(card)
    seeds = range(seed, seed + SEEDS)
    with one_thread():
        built = [models_for(pair, s, attend) for s in seeds]
        task = built[0][0]
        key = fixed_key(pair, seed, steps, device)
        fixed = (trained or {}).get(key)
        if fixed is None:
            fixed = train_side(card, task, attend, [b[1] for b in built], seeds, steps, device)
        if trained is not None:
            trained[key] = fixed
        buggy = train_side(card, task, attend, [b[2] for b in built], seeds, steps, device)
    claim = Claim(tuple(diagnose(f, b) for f, b in zip(fixed, buggy, strict=True)), seed)
    learning = Learning(task, fixed[claim.shown], buggy[claim.shown], claim)
    learning.note = note_for(card, learning)
    return learning


def learn_all(
    pairs: list[Pair], seed: int = 0, device: torch.device | None = None, steps: int = STEPS
) -> list[Learning]:
    """``learn`` each pair, fixed.py trained once for the pairs whose fixed.py trains alike."""
    trained: FixedRuns = {}
    return [learn(pair, seed, device, steps, trained) for pair in pairs]


def train_side(
    card: Card,
    task: Task,
    attend: Attend,
    models: list[TinyModel],
    seeds: range,
    steps: int,
    device: torch.device,
) -> list[Run]:
    """One side's models (``models[i]`` on seed ``seeds[i]``) trained together, then each
    evaluated (by generation, too, on a causal task)."""
    generate = generate_for(card, attend) if task.causal else None
    runs = train_seeds(models, task, attend, seeds, steps, device)
    return [
        evaluate(run, model, task, attend, generate, seed, device)
        for run, model, seed in zip(runs, models, seeds, strict=True)
    ]


def fixed_key(pair: Pair, seed: int, steps: int, device: torch.device) -> str:
    """What fixed.py's training depends on: its code, with comments and docstrings aside (two
    traps' fixed.py files often differ in nothing else), how the card builds it (the builder,
    the heads) and calls it (mask, convention, scenario), the seeds, steps and device."""
    tree = ast.parse(inspect.getsource(pair.fixed))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and is_docstring(body[0]):
            node.body = body[1:] or [ast.Pass()]
    card = pair.card
    build = f"{card.build.__module__}.{card.build.__qualname__}"  # a card's own: its trap's
    setup = (build, card.shape.heads, card.mask, card.convention, card.scenario)
    text = "\n".join([ast.dump(tree), repr(setup), repr((seed, steps, str(device)))])
    return hashlib.sha256(text.encode()).hexdigest()


def is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def models_for(pair: Pair, seed: int, attend: Attend) -> tuple[Task, TinyModel, TinyModel]:
    """Seed ``seed``'s task and tiny models: fixed.py's and buggy.py's modules built from the
    seed, the embeddings and read-out from seed + 1, shared by both."""
    card = pair.card
    fixed, buggy = build_pair(pair, learning_shape(card), seed)
    task = task_for(card, fixed)
    with seeded(seed + 1):
        fix_model = TinyModel(fixed, output_width(fixed, task, attend))
        bug_model = TinyModel(buggy, fix_model.readout.in_features)
    bug_model.load_state_dict(shared(fix_model), strict=False)
    return task, fix_model, bug_model


def shared(model: TinyModel) -> dict[str, Tensor]:
    """The tiny model's own weights (embeddings and read-out), which both modules share."""
    return {k: v for k, v in model.state_dict().items() if not k.startswith("attention.")}
