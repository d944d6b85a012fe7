"""Train the learning probe's model on every seed at once.

A training step of the tiny model costs per operation, not per number (a batch of 1 takes
nearly as long as a batch of 32), so the seeds of one module are trained as one model: their
weights stacked (``torch.func.stack_module_state``), one forward mapped over the seeds
(``torch.func.vmap``: seed i's weights on seed i's batch), one backward, and one Adam step over
a single flat buffer that holds every seed's parameters (a step over one tensor, not one per
parameter). Each seed computes what it would alone, within rounding: the same initial weights,
the same batches, the same update (Adam is elementwise). Dropout draws each seed's masks apart
(``randomness="different"``) from the stream seeded with the first seed.

A module that vmap cannot map (a branch on a tensor's value, ``.item()``, an in-place write into
a tensor it does not batch), and one that raises, is trained seed by seed instead
(``harness.learning.train``): a raise is then the module's, never vmap's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import pandas as pd
import torch
from torch import Tensor
from torch.func import functional_call, stack_module_state, vmap

from harness.inputs import generator
from harness.learning import (
    BATCH,
    LR,
    STEPS,
    Attend,
    Batch,
    Run,
    Task,
    TinyModel,
    accuracies,
    answer_loss,
    step_seed,
    train,
)
from harness.runner import manual_seed

FIELDS = ("tokens", "targets", "answers", "keep", "positions")  # what a training step reads


class Flat:
    """Named parameters laid out in one flat leaf tensor, each name a view into it."""

    def __init__(self, named: dict[str, Tensor]) -> None:
        self.names = list(named)
        self.shapes = [t.shape for t in named.values()]
        self.sizes = [t.numel() for t in named.values()]
        self.leaf = torch.cat([t.detach().reshape(-1) for t in named.values()]).requires_grad_()

    def views(self) -> dict[str, Tensor]:
        """Each parameter, shaped, as a view of the leaf (gradients reach the leaf)."""
        chunks = self.leaf.split(self.sizes)
        return {n: c.view(s) for n, c, s in zip(self.names, chunks, self.shapes, strict=True)}


# Stacked batches kept: every step of the two tasks that most traps train on (copy and recall),
# so that a worker draws each once, whichever traps it is given and in whatever order.
KEPT_STEPS = 4 * STEPS


@lru_cache(maxsize=KEPT_STEPS)
def stacked_batch(task: Task, seeds: tuple[int, ...], step: int) -> tuple[Tensor | None, ...]:
    """Step ``step``'s batch of every seed, each field stacked over the seeds: (S, B, ...) or
    None. Kept for the buggy run, which trains on the same batches as the fixed one, and for the
    next trap on the same task. Drawn as ``seeded_batch`` draws, without filling its cache."""
    batches = [task.draw(BATCH, generator(step_seed(seed, step))) for seed in seeds]
    return tuple(
        None if getattr(batches[0], f) is None else torch.stack([getattr(b, f) for b in batches])
        for f in FIELDS
    )


def train_seeds(
    models: Sequence[TinyModel],
    task: Task,
    attend: Attend,
    seeds: Sequence[int],
    steps: int = STEPS,
    device: torch.device | None = None,
) -> list[Run]:
    """Train ``models[i]`` on seed ``seeds[i]``'s batches, all at once where vmap can, else one
    after another; each model is left with its trained weights. The global RNG is restored."""
    device = device or torch.device("cpu")
    with torch.random.fork_rng(devices=[]):
        try:
            return together(models, task, attend, tuple(seeds), steps, device)
        except Exception:  # vmap cannot map the module, or it raises: each seed alone
            pass
    runs = []
    for model, seed in zip(models, seeds, strict=True):
        with torch.random.fork_rng(devices=[]):
            runs.append(train(model, task, attend, seed, steps, device))
    return runs


def together(
    models: Sequence[TinyModel],
    task: Task,
    attend: Attend,
    seeds: tuple[int, ...],
    steps: int,
    device: torch.device,
) -> list[Run]:
    """``train_seeds`` as one vmapped model; raises whatever the module or vmap raises, before
    any model is changed."""
    for model in models:
        model.to(device).train()
    params, buffers = stack_module_state(list(models))  # (S, ...) each
    flat = Flat(params)
    optimizer = torch.optim.Adam([flat.leaf], lr=LR)
    base = models[0]

    def one_seed(
        weights: dict[str, Tensor], kept: dict[str, Tensor], fields: tuple[Tensor | None, ...]
    ) -> tuple[Tensor, Tensor]:
        batch = Batch(*fields)
        logits, _ = functional_call(base, (weights, kept), (batch, attend))
        return answer_loss(logits, batch), logits

    first = stacked_batch(task, seeds, 1)
    dims = tuple(None if t is None else 0 for t in first)  # a field a task lacks stays None
    mapped = vmap(one_seed, in_dims=(0, 0, dims), randomness="different")
    manual_seed(seeds[0])
    rows: list[list[tuple[int, float, float]]] = [[] for _ in seeds]
    live = [True] * len(seeds)
    for step in range(1, steps + 1):
        fields = tuple(
            None if t is None else t.to(device) for t in stacked_batch(task, seeds, step)
        )
        losses, logits = mapped(flat.views(), buffers, fields)  # (S,), (S, B, T, VOCAB)
        scored = accuracies(logits, fields[1], fields[2])
        for i, (loss, hit) in enumerate(zip(losses.tolist(), scored, strict=True)):
            if live[i]:
                rows[i].append((step, loss, hit))
                live[i] = math.isfinite(loss)
        if not any(live):
            break
        optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()
        optimizer.step()
    with torch.no_grad():  # each model gets its seed's trained weights
        for name, stacked in flat.views().items():
            for model, trained in zip(models, stacked, strict=True):
                model.get_parameter(name).copy_(trained)
    return [Run(pd.DataFrame(r, columns=["step", "loss", "accuracy"])) for r in rows]
