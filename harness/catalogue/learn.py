"""The learning probe on a catalogue pair: train fixed.py and buggy.py from the same weights on
the same batches (harness.learning) and name what the bug does to learning.

The task follows the card: bidirectional modules learn associative recall (with padded rows when
the card's mask is padding); causal ones learn to copy, with left-padded rows, two packed
documents per row, or a prompt short enough for a sliding window where the card needs them.
Causal modules are also evaluated by generation: through the file's own ``KVCache`` in the
card's cached scenario (decoding, when the card measures the full forward), or, for a module
without a cache, by calling it on each prefix.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor, nn

from harness.catalogue.card import Card, Pair
from harness.catalogue.compare import build_pair
from harness.catalogue.verdicts import Verdict
from harness.learning import (
    BATCH,
    CLOSE_SEEDS,
    D_MODEL,
    SEQ_LEN,
    STEPS,
    Attend,
    Batch,
    Generate,
    Learning,
    Task,
    TinyModel,
    diagnose,
    evaluate,
    one_thread,
    over_seeds,
    prefix_generation,
    train,
)
from harness.masks import CAUSAL_KINDS
from harness.runner import seeded, split_output
from harness.scenarios import SCENARIOS, make_call
from harness.shapes import Shape

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


def learn(
    pair: Pair, seed: int = 0, device: torch.device | None = None, steps: int = STEPS
) -> Learning:
    """Train both modules of ``pair`` (same initial weights, same batches) and diagnose; a close
    call is diagnosed over CLOSE_SEEDS seeds from ``seed`` on before its label is stated."""
    device = device or torch.device("cpu")
    learning = learn_once(pair, seed, device, steps)
    if learning.diagnosis.close:
        later = range(seed + 1, seed + CLOSE_SEEDS)
        others = [learn_once(pair, s, device, steps).diagnosis for s in later]
        learning.diagnosis = over_seeds(learning.diagnosis, others, seed)
    learning.note = note_for(pair.card, learning)
    return learning


def learn_once(pair: Pair, seed: int, device: torch.device, steps: int) -> Learning:
    """One seed's training of both modules and its diagnosis."""
    card = pair.card
    attend = attend_for(card)
    generate = generate_for(card, attend)
    with one_thread():
        fixed, buggy = build_pair(pair, learning_shape(card), seed)
        task = task_for(card, fixed)
        with seeded(seed + 1):
            fix_model = TinyModel(fixed, output_width(fixed, task, attend))
            bug_model = TinyModel(buggy, fix_model.readout.in_features)
        bug_model.load_state_dict(shared(fix_model), strict=False)
        runs = []
        for model in (fix_model, bug_model):
            with torch.random.fork_rng():
                run = train(model, task, attend, seed, steps, device)
                causal = generate if task.causal else None
                runs.append(evaluate(run, model, task, attend, causal, seed, device))
    return Learning(task, runs[0], runs[1], diagnose(runs[0], runs[1]))


def shared(model: TinyModel) -> dict[str, Tensor]:
    """The tiny model's own weights (embeddings and read-out), which both modules share."""
    return {k: v for k, v in model.state_dict().items() if not k.startswith("attention.")}
