"""A model's attention layers, found by what they compute and how the model calls them.

Every submodule the model calls with hidden states, (B, T, d) or (T, B, d), is a candidate
(a sequence-first layer is turned round to (B, T, d) for the probes). It attends when called
again as the model called it, with one position's hidden state changed, its output moves at
another position (it mixes positions) and the call runs a softmax or an attention kernel. The
attention layers are the innermost ones: a block that holds an attention layer mixes positions
too, through it. Layers of one class with one configuration are one group,
probed once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from harness.doctor.causality import causal_table
from harness.doctor.model.call import BATCH, SEQ_LEN, ModelCall
from harness.doctor.model.replay import Slot, fresh
from harness.doctor.reading.facts import interpret
from harness.doctor.reading.record import record
from harness.runner import seeded, split_output

# What an attention layer runs: a softmax over its scores, or a kernel that does.
ATTENTION_FUNCTIONS = {
    torch.softmax, torch.nn.functional.softmax, Tensor.softmax,
    torch.nn.functional.scaled_dot_product_attention,
    # nn.MultiheadAttention's: its functional form, and the fused kernel it takes in eval mode
    torch.nn.functional.multi_head_attention_forward, torch._native_multi_head_attention,
}  # fmt: skip
# Attributes that number a layer rather than configure it.
NUMBERING = ("idx", "index", "layer_id", "layer_number", "layer_num", "block_id")
MIXING = 1e-4  # a position's share of another's output that counts as mixing, of its scale


class _Watch(TorchFunctionMode):
    """Calls ``seen()`` whenever a softmax or an attention kernel runs."""

    def __init__(self, seen: Callable[[], None]) -> None:
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        if func in ATTENTION_FUNCTIONS:
            self.seen()
        return func(*args, **(kwargs or {}))


@dataclass
class Call:
    """One recorded call of a submodule: its arguments and where the hidden states are."""

    path: str
    module: nn.Module
    slot: Slot
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    softmax: bool = False  # a softmax or an attention kernel ran inside one of its calls

    def run(self, x: Tensor) -> Tensor:
        """The output (B, T, ...) with ``x`` as hidden states."""
        args, kwargs = self.slot.put(*fresh(self.args, self.kwargs), x)
        with torch.no_grad(), seeded(0):  # the same dropout (left on in eval) each run
            return split_output(self.slot.output(self.module(*args, **kwargs)))[0]

    def masks_future(self) -> bool:
        """Called as recorded, changing the second half of the hidden states leaves the first
        half's outputs exactly as they were (a causal layer that does not say so)."""
        x = self.slot.take(self.args, self.kwargs)
        half = x.shape[1] // 2
        later = x.clone()
        later[:, half:] = -later[:, half:]
        try:
            return torch.equal(self.run(x)[:, :half], self.run(later)[:, :half])
        except Exception:
            return False

    def masks_future_itself(self) -> str:
        """Where the layer, called as recorded, masks the future with its own triangle (or
        tells SDPA ``is_causal``), read from one recorded call; "" where it shows neither."""
        x = self.slot.take(self.args, self.kwargs)
        placed = x.transpose(0, 1) if self.slot.sequence_first else x
        args, kwargs = self.slot.place(*fresh(self.args, self.kwargs), placed)
        with torch.no_grad(), seeded(0):  # as ``run``: a cache it fills keeps no graph
            found = record(self.module, lambda: self.module(*args, **kwargs), {"x": placed})
        return interpret(found, x.shape[-1]).masks_future

    def causal_mask_given(self) -> str:
        """The argument of the recorded call that is a causal mask (square, lower-triangular,
        as bool, 0/1 or additive), "" when none is: what its model hands it."""
        try:  # a positional argument by its parameter's name
            params = list(inspect.signature(self.module.forward).parameters)
        except (TypeError, ValueError):
            params = []
        named = [*(params[i] if i < len(params) else f"argument {i}"
                   for i in range(len(self.args))), *self.kwargs]  # fmt: skip
        given = [*self.args, *self.kwargs.values()]
        return next((name for name, value in zip(named, given, strict=True)
                     if isinstance(value, Tensor) and causal_table(value)), "")  # fmt: skip

    def mixes(self) -> bool:
        """Changing the first token moves another's output, or changing the last does (a
        sliding window shorter than the sequence keeps the first from the last)."""
        x = self.slot.take(self.args, self.kwargs)
        try:
            base = self.run(x)
            if base.dim() < 2 or tuple(base.shape[:2]) != tuple(x.shape[:2]):
                return False
            # a change well past rounding: a mixture-of-experts block moves other tokens by
            # rounding alone when one token's route changes the order of its sums
            beyond = MIXING * base.abs().max().item()
            T = x.shape[1]
            for moved in (0, T - 1):  # first and last: one of them reaches another, causal or not
                other = x.clone()
                other[:, moved] = -other[:, moved]
                rest = [t for t in range(T) if t != moved]
                if (self.run(other)[:, rest] - base[:, rest]).abs().max().item() > beyond:
                    return True
        except Exception:
            return False
        return False


@dataclass
class Group:
    """Attention layers of one class with one configuration, probed once (the first)."""

    paths: list[str]
    module: nn.Module = field(repr=False)
    call: Call | None = field(default=None, repr=False)  # the first layer's recorded call

    @property
    def path(self) -> str:
        return self.paths[0]

    @property
    def cls(self) -> str:
        return type(self.module).__name__


@dataclass
class _Seen:
    """What one forward showed: each submodule's first call, by path, and the paths inside
    which a softmax or an attention kernel ran."""

    calls: dict[str, tuple[nn.Module, tuple, dict]] = field(default_factory=dict)
    softmax: set[str] = field(default_factory=set)
    running: list[str] = field(default_factory=list)  # the submodules being called, outermost first


@contextmanager
def _recording(model: nn.Module) -> Iterator[_Seen]:
    """Hooks on every submodule for the block: their first calls, and where a softmax ran."""
    seen = _Seen()
    handles = []
    for path, module in model.named_modules():
        if not path:
            continue

        def enter(m: nn.Module, args: tuple, kwargs: dict, path: str = path) -> None:
            if path not in seen.calls:  # its state before the call (a cache it will update)
                seen.calls[path] = (m, *fresh(args, kwargs))
            seen.running.append(path)

        def leave(m: nn.Module, args: tuple, output: object) -> None:
            seen.running.pop()

        handles.append(module.register_forward_pre_hook(enter, with_kwargs=True))
        handles.append(module.register_forward_hook(leave, always_call=True))
    watch = _Watch(lambda: seen.softmax.update(seen.running))
    try:
        with watch:
            yield seen
    finally:
        for handle in handles:
            handle.remove()


def record_calls(model: nn.Module, call: ModelCall, seed: int) -> list[Call]:
    """The calls of one seeded forward whose arguments hold hidden states, (B, T, d) or
    (T, B, d)."""
    ids = call.tokens(BATCH, SEQ_LEN, seed)
    with _recording(model) as seen, torch.no_grad():
        call.run(model, ids)
    found = []
    for path, (module, args, kwargs) in seen.calls.items():
        try:
            slot = Slot.find(args, kwargs, BATCH, SEQ_LEN)
        except LookupError:
            continue
        found.append(Call(path, module, slot, args, kwargs, path in seen.softmax))
    return found


def attention_layers(model: nn.Module, call: ModelCall, seed: int = 0) -> list[Call]:
    """The calls that mix positions and run a softmax, innermost: none of the submodules they
    call mixes positions itself (a block holding attention mixes through it; a block whose
    mixing is a recurrence and whose softmax is a router's is no attention layer). In the
    model's order; the innermost are tried first, so a block around a layer already found is
    never replayed."""
    calls = record_calls(model, call, seed)
    mixing: dict[str, bool] = {}

    def mixes(c: Call) -> bool:
        if c.path not in mixing:
            mixing[c.path] = c.mixes()
        return mixing[c.path]

    found: set[str] = set()
    for c in sorted((c for c in calls if c.softmax), key=lambda c: -c.path.count(".")):
        if any(p.startswith(c.path + ".") for p in found) or not mixes(c):
            continue
        if not any(mixes(o) for o in calls if o.path.startswith(c.path + ".")):
            found.add(c.path)
    return [c for c in calls if c.path in found]


def _settings(module: nn.Module) -> tuple[object, ...]:
    """What configures a layer: its class, parameter shapes and plain attributes (not its
    number in the stack)."""
    plain = sorted(
        (name, value) for name, value in vars(module).items()
        if isinstance(value, int | float | str | bool | type(None)) and not name.startswith("_")
        and not any(word in name.lower() for word in NUMBERING)
    )  # fmt: skip
    shapes = tuple((n, tuple(p.shape)) for n, p in module.named_parameters())
    return (type(module), tuple(plain), shapes)


def _call_form(call: Call) -> tuple[object, ...]:
    """What configures the call: the arguments' types and shapes, and which scores a mask
    blocks (a sliding layer's mask differs from a global one's)."""

    def form(value: object) -> object:
        if isinstance(value, Tensor):
            blocked = (
                value.isinf() | (value == torch.finfo(value.dtype).min)
                if value.is_floating_point()
                else value
            )
            return (tuple(value.shape), str(value.dtype), blocked.cpu().numpy().tobytes())
        if isinstance(value, tuple | list):
            return tuple(form(v) for v in value)
        if isinstance(value, int | float | str | bool | type(None)):
            return value
        return type(value).__name__

    named = sorted((k, form(v)) for k, v in call.kwargs.items()
                   if not any(word in k.lower() for word in NUMBERING))  # fmt: skip
    return (tuple(form(a) for a in call.args), tuple(named))


def grouped(layers: list[Call]) -> list[Group]:
    """Layers of one configuration, called alike, as one group (first seen first)."""
    groups: dict[tuple[object, ...], Group] = {}
    for layer in layers:
        key = (_settings(layer.module), _call_form(layer))
        if key in groups:
            groups[key].paths.append(layer.path)
        else:
            groups[key] = Group([layer.path], layer.module, layer)
    return list(groups.values())
