"""The doctor's one recorded forward: the subject called as the probes call it, on ordinary
inputs (seeded, its mask as declared), recorded once and read (``harness.doctor.reading.facts``)
for the causality the doctor settles on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from torch import Tensor, nn

from harness.doctor.reading.facts import interpret
from harness.doctor.reading.known import Named, Reading
from harness.doctor.reading.ops import SDPA, SOFTMAX
from harness.doctor.reading.record import Record, built_at, record, written_at, written_from

if TYPE_CHECKING:
    from harness.doctor.subject import Subject

SEED = 11  # the recorded call's inputs: any seed; not one a probe uses


# what the module's own masks, read from a call without the caller's, may name
OWN_MASKS = ("causal_leak", "sliding_window_off_by_one", "mask_bool")


@dataclass
class Watched:
    """One recorded call of a copy of the subject, and the keep-mask it was given."""

    subject: Subject
    found: Record
    keep: Tensor | None
    finite: bool = True  # the call's output holds no NaN or infinity
    alone: Record | None = None  # the same call without a mask, where one was recorded
    second_not_weights: str = ""  # where a second output that is no softmax's was made

    def _read(self, found: Record, keep: Tensor | None, causal: bool) -> Reading:
        subject = self.subject
        return interpret(
            found,
            subject.d_model,
            keep=keep,
            declared_scale=subject.config.scale,
            made=lambda name: made_where(subject, name),
            causal=causal,
            declared_pairing=subject.config.rope_pairing,
        )

    def _own_masks(self, reading: Reading, causal: bool) -> None:
        """Where the module joins a triangle or band it built to the caller's mask, which
        hides it, what the same call without a mask shows of it: the traps its own masks name,
        added to ``reading`` (one more recorded call, only then)."""
        if not reading.joins_own or self.keep is None:
            return
        if self.alone is None:
            subject = self.subject
            x = subject.x(subject.config.batch, subject.config.seq_len, SEED)
            try:
                self.alone = recorded(subject, x, None)
            except Exception:  # it needs its mask: what it joins stays hidden
                return
        alone = self._read(self.alone, None, causal)
        had = {n.trap for n in reading.named}
        reading.named += [n for n in alone.named if n.trap in OWN_MASKS and n.trap not in had]
        reading.facts += [replace(f, name=f"{f.name} (called without a mask)")
                          for f in alone.facts if f.name == "future"]  # fmt: skip

    def reading(self, causal: bool) -> Reading:
        """The record read for a module held to be ``causal`` (a leak is named only then)."""
        subject = self.subject
        reading = self._read(self.found, self.keep, causal)
        reading.second_not_weights = self.second_not_weights
        self._own_masks(reading, causal)
        read = [reading.projections.get(role) or "" for role in ("queries", "keys")]
        read.sort(key=lambda name: -_gain(subject.module, name))  # the larger draw first
        weights = [n for n, p in subject.module.named_parameters() if p.dim() == 2]
        drawn = [made_where(subject, name, written_at) for name in (*read, *weights)]
        # then the lines of its own class that handed a helper what it drew them with
        drawn += [made_where(subject, name, written_from) for name in (*read, *weights)]
        lines = list(dict.fromkeys(d for d in drawn if d))  # the projections read first
        if lines:  # where a probe finds the weights saturated at init, the inits to look at
            said = "the projections' weights are drawn by the module's own init"
            # first: weights drawn too large make every other error larger too
            reading.named.insert(0, Named("init_unit_variance", said, lines[0], tuple(lines[1:])))
        return reading


def _gain(module: nn.Module, name: str) -> float:
    """How much a projection weight ``name`` scales its input as drawn: its spread times the
    square root of its fan-in (about 1 for unit-variance outputs); 0 where it is no matrix."""
    weight = dict(module.named_parameters()).get(name)
    if weight is None or weight.dim() != 2:
        return 0.0
    return float(weight.detach().double().std()) * weight.shape[1] ** 0.5


def recorded(subject: Subject, x: Tensor, keep: Tensor | None) -> Record:
    """One call of a copy of the subject on ``x`` under ``keep``, recorded (what the call
    raises, it raises)."""
    module = subject.copy()
    return record(module, lambda: subject.call(module, x, keep), {"x": x})


def watch(subject: Subject) -> Watched:
    """Record one call of a copy of the subject on ordinary inputs."""
    config = subject.config
    module = subject.copy()
    x = subject.x(config.batch, config.seq_len, SEED)
    keep = subject.ordinary_keep(config.batch, config.seq_len)
    outputs: list[tuple[Tensor, Tensor | None]] = []
    found = record(module, lambda: outputs.append(subject.call(module, x, keep)), {"x": x})
    out, weights = outputs[0] if outputs else (None, None)
    finite = not isinstance(out, Tensor) or bool(out.isfinite().all())
    # the module's code runs its attention where the record sees it (a softmax, or SDPA,
    # which returns no weights), and the second output is not computed from a softmax;
    # where the record sees neither, the weights are made inside an op it does not see into
    softmaxed = any(op.name in DISTRIBUTING | SDPA and op.line for op in found.ops)
    other = ""
    if weights is not None and softmaxed and distributed(found, weights) is False:
        other = _made(found, weights)
    return Watched(subject, found, keep, finite, second_not_weights=other)


# Ops that make a distribution over the keys: a softmax, or the exp a written-out one divides
DISTRIBUTING = frozenset({*SOFTMAX, "exp", "exp_"})


def distributed(found: Record, tensor: Tensor) -> bool | None:
    """Whether ``tensor`` (a result the record holds) is computed from a softmax, or from the
    exp of a written-out one (None: the record does not hold it)."""
    start = next((op.index for op, results in zip(found.ops, found.results, strict=True)
                  if any(r is tensor for r in results)), None)  # fmt: skip
    if start is None:
        return None
    return any(found.ops[index].name in DISTRIBUTING for index in found.ancestors(start))


def _made(found: Record, tensor: Tensor) -> str:
    """Where the record made ``tensor``."""
    op = next(op for op, results in zip(found.ops, found.results, strict=True)
              if any(r is tensor for r in results))  # fmt: skip
    return op.where or "the harness"


def made_where(
    subject: Subject, name: str, where: Callable[[nn.Module, str], str] = built_at
) -> str:
    """Where the module's tensor ``name`` was made (``where``: or last written), when the
    doctor built it (a wrapper's name has one more part than the module's)."""
    for module in (subject.module, subject.original):
        for candidate in (name, name.split(".", 1)[-1]):
            line = where(module, candidate) if candidate else ""
            if line:
                return line
    return ""
