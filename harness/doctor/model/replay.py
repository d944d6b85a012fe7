"""A layer called as its model calls it: record the arguments of a real model forward with a
forward pre-hook, then call the layer with the same arguments and other hidden states.

The layer probes hand this adapter hidden states ``x`` (B, T, d), positions and a key padding
mask; the model is run on token ids of that shape, with that mask as its attention mask and
those positions as its position ids, and stopped where it calls the layer. The layer is then
called with everything the model passed (its own mask, rotary tables, flags, a layer index) but
``x`` in place of the hidden states.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from harness.doctor.model.call import ModelCall
from harness.masks import lowest
from harness.runner import as_dtype


class Recorded(Exception):
    """Raised by the pre-hook to stop the model where it calls the layer."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]):
        super().__init__("recorded")
        self.args = args
        self.kwargs = kwargs


@dataclass(frozen=True)
class Slot:
    """Where a call holds its hidden states: positional index, or keyword name."""

    index: int | None = None
    name: str | None = None

    @classmethod
    def find(cls, args: tuple[Any, ...], kwargs: dict[str, Any], batch: int, seq_len: int) -> Slot:
        """The first floating tensor of shape (B, T, d) among the arguments."""

        def hidden(value: object) -> bool:
            return (isinstance(value, Tensor) and value.is_floating_point() and value.dim() == 3
                    and tuple(value.shape[:2]) == (batch, seq_len))  # fmt: skip

        for i, value in enumerate(args):
            if hidden(value):
                return cls(index=i)
        for name, value in kwargs.items():
            if hidden(value):
                return cls(name=name)
        raise LookupError("no (B, T, d) hidden states among the layer's arguments")

    def take(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        return args[self.index] if self.index is not None else kwargs[self.name]

    def put(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], x: Tensor
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if self.index is not None:
            return (*args[: self.index], x, *args[self.index + 1 :]), kwargs
        return args, {**kwargs, self.name: x}


def record(
    model: nn.Module, layer: nn.Module, call: ModelCall, ids: Tensor, **given: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments the model passes ``layer`` (one of its modules) in a forward on ``ids``,
    the model stopped there."""

    def stop(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        raise Recorded(args, kwargs)

    handle = layer.register_forward_pre_hook(stop, with_kwargs=True)
    try:
        with torch.no_grad():
            call.run(model, ids, **given)
    except Recorded as found:
        return found.args, found.kwargs
    finally:
        handle.remove()
    raise LookupError("the model's forward never called the layer")


def _as_built(value: Any) -> Any:
    if isinstance(value, Tensor) and value.dtype == torch.float64:
        return value.clamp(min=lowest(torch.float64))
    if isinstance(value, tuple | list):
        return type(value)(_as_built(v) for v in value)
    return value


def as_built(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict]:
    """The recorded arguments with a float64 mask's fill raised to float32's ``finfo.min``, as
    the model builds it in the dtype it runs in: the doctor's float64 copy would otherwise pass
    float64's, which a layer that computes its softmax in float32 (transformers' eager) turns
    into -inf, and a row with no key into NaN that no real run shows."""
    return _as_built(args), {k: _as_built(v) for k, v in kwargs.items()}


class Replay:
    """A ``--call`` adapter for one layer of a model: ``(module, x, *, positions, mask,
    cache)``, calling ``module`` (the doctor's copy of the layer) with what the model passes it.

    The mask is a key padding mask (B, T), 1 for a real token, given to the model as its
    attention mask. Recordings are kept per shape, dtype, mask and positions.
    """

    kv_grouping = "auto"

    def __init__(self, model: nn.Module, path: str, call: ModelCall, seed: int = 0):
        self.model = model
        self.path = path
        self.call = call
        self.seed = seed
        self._copies: dict[tuple[torch.dtype, torch.device], nn.Module] = {}
        self._calls: dict[tuple[object, ...], tuple[Slot, tuple[Any, ...], dict[str, Any]]] = {}

    def _model(self, dtype: torch.dtype, device: torch.device) -> nn.Module:
        key = (dtype, device)
        if key not in self._copies:
            self._copies[key] = as_dtype(self.model, device, dtype).eval()
        return self._copies[key]

    def recorded(
        self, x: Tensor, positions: Tensor, mask: Tensor | None
    ) -> tuple[Slot, tuple[Any, ...], dict[str, Any]]:
        """How the model calls the layer on a batch of x's shape, with that mask and those
        positions."""
        B, T = x.shape[:2]
        ordinary = bool((positions == torch.arange(T, device=positions.device)).all())
        if not ordinary and self.call.positions is None:
            if self._positions_reach_layer(x, mask):
                raise NotImplementedError("the model takes no position ids")
            ordinary = True  # the layer gets nothing that depends on positions
        key = (B, T, x.dtype, x.device, None if mask is None else mask.cpu().numpy().tobytes(),
               None if ordinary else positions.cpu().numpy().tobytes())  # fmt: skip
        if key not in self._calls:
            model = self._model(x.dtype, x.device)
            given: dict[str, Any] = {}
            if mask is not None:
                given["mask"] = mask.reshape(B, T).to(x.device, torch.long)
            if not ordinary:
                given["positions"] = positions.to(x.device, torch.long)
            ids = self.call.tokens(B, T, self.seed).to(x.device)
            args, kwargs = record(model, model.get_submodule(self.path), self.call, ids, **given)
            self._calls[key] = (Slot.find(args, kwargs, B, T), *as_built(args, kwargs))
        return self._calls[key]

    def _positions_reach_layer(self, x: Tensor, mask: Tensor | None) -> bool:
        """The model passes the layer more than hidden states of the sequence's length (rotary
        tables, a position bias): positions it computes itself, which ids cannot move."""
        T = x.shape[1]
        slot, args, kwargs = self.recorded(x, torch.arange(T, device=x.device), mask)
        others = [v for i, v in enumerate(args) if i != slot.index]
        others += [v for k, v in kwargs.items() if k != slot.name]
        flat = [t for v in others for t in (v if isinstance(v, tuple | list) else (v,))]
        return any(isinstance(t, Tensor) and t.is_floating_point() and T in t.shape
                   and t.dim() >= 2 for t in flat)  # fmt: skip

    def __call__(
        self, module: nn.Module, x: Tensor, *, positions: Tensor, mask: Tensor | None, cache: object
    ) -> object:
        if cache is not None:
            raise NotImplementedError("the layer's cache is probed on the whole model")
        slot, args, kwargs = self.recorded(x, positions, mask)
        args, kwargs = slot.put(args, kwargs, x)
        return module(*args, **kwargs)
