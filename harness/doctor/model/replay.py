"""A layer called as its model calls it: record the arguments of a real model forward with a
forward pre-hook, then call the layer with the same arguments and other hidden states.

The layer probes hand this adapter hidden states ``x`` (B, T, d), positions and a key padding
mask; the model is run on token ids of that shape, with that mask as its attention mask and
those positions as its position ids, and stopped where it calls the layer. The layer is then
called with everything the model passed (its own mask, rotary tables, flags, a layer index) but
``x`` in place of the hidden states.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch import Tensor, nn

from harness.doctor.model.call import BATCH, SEQ_LEN, ModelCall, keeps_state, no_autocast
from harness.doctor.stated import declared_context
from harness.errors import UsageError
from harness.inputs import generator
from harness.masks import lowest
from harness.runner import as_dtype, describe


class NotCalled(LookupError):
    """The model does not hand the layer hidden states it can be probed on: none among its
    arguments, or no call at all."""


class Recorded(BaseException):
    """Raised by the pre-hook to stop the model where it calls the layer: a BaseException, so
    that no ``except Exception`` on the way (the model's, a retry's) takes it for an error."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]):
        super().__init__("recorded")
        self.args = args
        self.kwargs = kwargs


@dataclass(frozen=True)
class Slot:
    """Where a call holds its hidden states: the positional indices and keyword names of every
    argument that is that tensor (a self-attention called as ``attn(x, x, x, mask)`` takes it
    as query, key and value)."""

    indices: tuple[int, ...] = ()
    names: tuple[str, ...] = ()
    # the model passes them (T, B, d), as fairseq's layers and nn.MultiheadAttention's default
    # take them; the slot turns them round, so a caller always sees (B, T, d)
    sequence_first: bool = False

    @classmethod
    def find(
        cls, args: tuple[Any, ...], kwargs: dict[str, Any], batch: int, seq_len: int,
        sequence_first: bool | None = None,
    ) -> Slot:  # fmt: skip
        """The first floating tensor of shape (B, T, d) among the arguments, else of (T, B, d),
        wherever the call passes that same tensor; only in the layout given, when one is (a
        batch as long as its sequences cannot tell the two apart)."""
        layouts = ((False, (batch, seq_len)), (True, (seq_len, batch)))
        for first_is_sequence, shape in layouts:
            if sequence_first is not None and first_is_sequence != sequence_first:
                continue

            def hidden(value: object, shape: tuple[int, int] = shape) -> bool:
                return (isinstance(value, Tensor) and value.is_floating_point()
                        and value.dim() == 3 and tuple(value.shape[:2]) == shape)  # fmt: skip

            first = next((v for v in (*args, *kwargs.values()) if hidden(v)), None)
            if first is not None:
                return cls(indices=tuple(i for i, v in enumerate(args) if v is first),
                           names=tuple(k for k, v in kwargs.items() if v is first),
                           sequence_first=first_is_sequence)  # fmt: skip
        raise NotCalled("no (B, T, d) or (T, B, d) hidden states among the layer's arguments")

    def take(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
        """The hidden states, (B, T, d)."""
        x = args[self.indices[0]] if self.indices else kwargs[self.names[0]]
        return x.transpose(0, 1) if self.sequence_first else x

    def output(self, result: Any) -> Any:
        """The layer's output (or its first element, the attention weights as they are) as
        (B, T, ...)."""
        if not self.sequence_first:
            return result
        if isinstance(result, Tensor):
            return result.transpose(0, 1)
        if isinstance(result, tuple | list) and result and isinstance(result[0], Tensor):
            return (result[0].transpose(0, 1), *result[1:])
        return result

    def holds(self, index: int | None = None, name: str | None = None) -> bool:
        """Whether the argument at ``index`` (or named ``name``) is the hidden states."""
        return index in self.indices or name in self.names

    def put(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], x: Tensor
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments with ``x`` (B, T, d) as the hidden states, in the layer's layout."""
        return self.place(args, kwargs, x.transpose(0, 1) if self.sequence_first else x)

    def place(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], placed: Tensor
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The arguments with ``placed``, already in the layer's layout, as the hidden states."""
        args = tuple(placed if i in self.indices else v for i, v in enumerate(args))
        return args, {**kwargs, **dict.fromkeys(self.names, placed)}


def record(
    model: nn.Module, layer: nn.Module, call: ModelCall, ids: Tensor, **given: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments the model passes ``layer`` (one of its modules) in a forward on ``ids``,
    the model stopped there."""

    def stop(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        raise Recorded(*fresh(args, kwargs))

    handle = layer.register_forward_pre_hook(stop, with_kwargs=True)
    try:
        with torch.no_grad():
            call.run(model, ids, **given)
    except Recorded as found:
        return found.args, found.kwargs
    finally:
        handle.remove()
    raise NotCalled("the model's forward never called the layer")


def _leaves(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """``value`` with ``leaf`` applied to everything in it that is not a tuple, list or dict
    (the arguments of a call, nested as the model nests them)."""
    if isinstance(value, tuple | list):
        return type(value)(_leaves(v, leaf) for v in value)
    if isinstance(value, dict):
        return {k: _leaves(v, leaf) for k, v in value.items()}
    return leaf(value)


def _fill_as_built(value: Any) -> Any:
    if isinstance(value, Tensor) and value.dtype == torch.float64:
        return value.clamp(min=lowest(torch.float64))
    return value


def as_built(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict]:
    """The recorded arguments with a float64 mask's fill raised to float32's ``finfo.min``, as
    the model builds it in the dtype it runs in: the doctor's float64 copy would otherwise pass
    float64's, which a layer that computes its softmax in float32 (transformers' eager) turns
    into -inf, and a row with no key into NaN that no real run shows."""
    return _leaves(args, _fill_as_built), _leaves(kwargs, _fill_as_built)


def _cast(value: Any, dtype: torch.dtype) -> Any:
    """Floating tensors in ``value`` cast to ``dtype``."""
    return _leaves(value, lambda v: v.to(dtype) if isinstance(v, Tensor) and v.is_floating_point()
                   else v)  # fmt: skip


def _copied(value: Any) -> Any:
    """A copy of a stateful argument (a cache the layer updates in place), so that each replay
    starts from the state the model passed; tensors, plain values and modules as they are."""
    if isinstance(value, Tensor) and value.is_inference():  # recorded under inference_mode
        return value.clone()  # (Meta's Llama decorates its forward): one autograd can take
    if isinstance(value, Tensor | nn.Module | int | float | str | bool | type(None)):
        return value
    try:
        return copy.deepcopy(value)
    except Exception:  # a handle, a lock: taken as it is
        return value


def fresh(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict]:
    """The arguments, each stateful one copied (``_copied``)."""
    return _leaves(args, _copied), _leaves(kwargs, _copied)


def _is_mask(t: Tensor) -> bool:
    """A mask: additive (0 where allowed, a large negative fill or -inf where blocked) or 0/1
    (CTRL's causal mask, multiplied by its fill inside the layer)."""
    return bool(((t == 0) | (t <= -1e4)).all() or ((t == 0) | (t == 1)).all())


def _rotary_table(value: Any) -> int | None:
    """The width a rotary table turns: a (cos, sin) pair of one shape, its last dimension;
    complex frequencies, twice theirs; a real (.., d/2, 2) table of points on the unit circle
    (gpt-fast's ``freqs_cis``, cos and sin stacked last), twice its second to last; None for
    anything else."""
    if isinstance(value, Tensor) and value.is_complex():
        return 2 * value.shape[-1]
    if (isinstance(value, Tensor) and value.is_floating_point() and value.dim() >= 2
            and value.shape[-1] == 2 and value.numel()):  # fmt: skip
        radius = value.double().pow(2).sum(-1)
        if torch.allclose(radius, torch.ones_like(radius), atol=1e-3):
            return 2 * value.shape[-2]
    pair = isinstance(value, tuple | list) and len(value) == 2 and all(
        isinstance(t, Tensor) and t.is_floating_point() for t in value)  # fmt: skip
    return value[0].shape[-1] if pair and value[0].shape == value[1].shape else None


def _same(a: Any, b: Any) -> bool:
    """Two recorded calls are equal: every tensor equal, every other value equal."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return (isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape
                and bool(torch.equal(a, b)))  # fmt: skip
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, int | float | str | bool | type(None)):
        return a == b
    return type(a) is type(b)  # objects made per forward (a cache, a block mask) by their kind


class Replay:
    """A ``--call`` adapter for one layer of a model: ``(module, x, *, positions, mask,
    cache)``, calling ``module`` (the doctor's copy of the layer) with what the model passes it.

    The mask is a key padding mask (B, T), 1 for a real token, given to the model as its
    attention mask. Recordings are kept per shape, dtype, mask and positions.
    """

    from_model = True  # what the layer gets is its model's own: its mask, its positions

    def __init__(self, model: nn.Module, path: str, call: ModelCall, seed: int = 0):
        self.model = model
        self.path = path
        self.call = call
        self.seed = seed
        self.context = declared_context(model)  # the longest sequence the model takes
        self._copies: dict[tuple[torch.dtype, torch.device], nn.Module] = {}
        self._calls: dict[tuple[object, ...], tuple[Slot, tuple[Any, ...], dict[str, Any]]] = {}
        self.sequence_first: bool | None = None  # its layout, where the model's forward showed it

    @property
    def kv_grouping(self) -> str:
        """How its grouped K/V heads are laid out: in blocks for a transformers model (its
        checkpoints are, and its repeat_kv interleaves), else not known ("auto")."""
        return "blocks" if type(self.model).__module__.startswith("transformers.") else "auto"

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
        if not ordinary and not self.call.takes_positions:
            if self._positions_reach_layer(x, mask):
                raise NotImplementedError("the model takes no position ids")
            ordinary = True  # the layer gets nothing that depends on positions
        if not ordinary and self.keeps_cache:
            raise NotImplementedError(
                "its positions index a cache the model keeps: tokens at other positions need "
                "the tokens before them in it (the model's cached generation probes that)"
            )
        key = (B, T, x.dtype, x.device, None if mask is None else mask.cpu().numpy().tobytes(),
               None if ordinary else positions.cpu().numpy().tobytes())  # fmt: skip
        if key not in self._calls:
            given: dict[str, Any] = {}
            if mask is not None:
                given["mask"] = mask.reshape(B, T).to(x.device, torch.long)
            if not ordinary:
                given["positions"] = positions.to(x.device, torch.long)
            ids = self.call.tokens(B, T, self.seed).to(x.device)
            args, kwargs = self._record(ids, x.dtype, x.device, given)
            slot = Slot.find(args, kwargs, B, T, self.sequence_first)
            self._calls[key] = (slot, *as_built(args, kwargs))
        return self._calls[key]

    def _record(
        self, ids: Tensor, dtype: torch.dtype, device: torch.device, given: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The layer's arguments; a model that cannot make them for ``ids`` (more tokens than
        its table of positions holds) does not take that probe's input: the layer is not
        failed for what its model cannot do before calling it."""
        try:
            return self._arguments(ids, dtype, device, given)
        except (NotCalled, NotImplementedError, UsageError):
            raise  # (an IndexError, a LookupError too, is the model's: its table is too short)
        except Exception as exc:
            B, T = ids.shape
            raise NotImplementedError(
                f"its model does not run on {B} x {T} tokens before this layer: {describe(exc)}"
            ) from exc

    def _arguments(
        self, ids: Tensor, dtype: torch.dtype, device: torch.device, given: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The layer's arguments from a model copy in ``dtype``; for a model whose earlier
        layers do not run in float64 (a grouped matmul of experts), from its float32 copy,
        floating tensors then cast to ``dtype``."""
        model = self._model(dtype, device)
        try:
            return record(model, model.get_submodule(self.path), self.call, ids, **given)
        except (LookupError, NotImplementedError):
            raise
        except Exception:
            if dtype != torch.float64:
                raise
        model = self._model(torch.float32, device)
        args, kwargs = record(model, model.get_submodule(self.path), self.call, ids, **given)
        return _cast(args, dtype), _cast(kwargs, dtype)

    @cached_property
    def unused_by_model(self) -> frozenset[str]:
        """The layer's parameters (by name within it) that no gradient reaches in a backward
        through the model's own logits: a weight its model never uses as called (an entity
        query without entity inputs, a top-k indexer, a long-context branch)."""
        model = as_dtype(self.model, torch.device("cpu"), torch.float32).train(False)
        ids = self.call.tokens(BATCH, SEQ_LEN, self.seed)
        logits = self.call.run(model, ids)
        weights = torch.randn(logits.shape, generator=generator(self.seed))
        (logits.float() * weights).sum().backward()
        layer = model.get_submodule(self.path)
        return frozenset(n for n, p in layer.named_parameters()
                         if p.grad is None or not bool(p.grad.any()))  # fmt: skip

    def padding_reaches_layer(self) -> bool:
        """The model's attention mask changes what the model passes the layer (a decoder's
        self-attention in an encoder-decoder gets the encoder's padding only through the
        cross-attention): the layer probes pad through it only then."""
        if self.call.mask is None:
            return False
        x = torch.zeros(2, 4, 1)  # the shape of a batch; only B and T are read
        positions = torch.arange(4).expand(2, 4)
        keep = torch.ones(2, 4)
        left = keep.clone()
        left[0, 0] = 0
        _, args, kwargs = self.recorded(x, positions, keep)
        _, args_left, kwargs_left = self.recorded(x, positions, left)
        return not _same((args, kwargs), (args_left, kwargs_left))

    def _position_inputs(self, x: Tensor, mask: Tensor | None) -> str:
        """What the model passes the layer besides the hidden states and masks that carries
        positions it computes itself: "" (nothing), "rotary" (a (cos, sin) pair of one shape,
        together or as two arguments, or complex frequencies), or "bias" (any other floating
        tensor of two or more dimensions: ALiBi's slopes (h, 1, L), relative buckets
        (.., h, T, T))."""
        found, tables = "", []
        for value in self._others(x, mask):
            if _rotary_table(value) is not None:
                found = found or "rotary"
            elif (isinstance(value, Tensor) and value.is_floating_point() and value.dim() >= 2
                  and not _is_mask(value)):  # fmt: skip
                tables.append(value)
        if len(tables) == 2 and _rotary_table(tuple(tables)) is not None:
            return "rotary"  # cos and sin passed apart (litgpt's attn(x, cos, sin, mask))
        return "bias" if tables else found

    def _others(self, x: Tensor, mask: Tensor | None, shift: int = 0) -> list[Any]:
        """What the model passes the layer besides its hidden states, on an ordinary batch
        (its positions shifted by ``shift``)."""
        T = x.shape[1]
        slot, args, kwargs = self.recorded(x, torch.arange(T, device=x.device) + shift, mask)
        others = [v for i, v in enumerate(args) if not slot.holds(index=i)]
        return others + [v for k, v in kwargs.items() if not slot.holds(name=k)]

    def _positions_reach_layer(self, x: Tensor, mask: Tensor | None) -> bool:
        return bool(self._position_inputs(x, mask))

    @cached_property
    def ignores_positions(self) -> bool:
        """The positions an adapter call is given cannot reach the layer: the model takes
        none (it may pass rotary tables it makes for 0..T-1, or the layer may build them from
        arange(T)), they index a cache it keeps, or it takes them and hands its layer the same
        rotary tables whatever they are (a forward that overwrites its position ids)."""
        # tables it makes from 0..T-1 (GPT-J's sincos) or other positions indexing a cache it
        # keeps: the layer gets those of 0..T-1 whatever a probe asks
        if not self.call.takes_positions or self.keeps_cache:
            return True
        return self.hands_rotary_tables and not self._tables_follow_positions()

    def _tables_follow_positions(self) -> bool:
        """The rotary tables the model hands its layer change with the position ids it is
        given."""
        x = torch.zeros(2, 7, 1)  # the shape of a batch; only B and T are read
        return not _same(self._others(x, None), self._others(x, None, shift=3))

    def position_inputs(self) -> str:
        """``_position_inputs`` on an ordinary batch."""
        return self._position_inputs(torch.zeros(2, 7, 1), None)

    @cached_property
    def hands_rotary_tables(self) -> bool:
        """Its model passes the layer rotary tables it makes (``position_inputs``)."""
        return self.position_inputs() == "rotary"

    def __call__(
        self, module: nn.Module, x: Tensor, *, positions: Tensor, mask: Tensor | None, cache: object
    ) -> object:
        if cache is not None:
            raise NotImplementedError("the layer's cache is probed on the whole model")
        slot, args, kwargs = self.recorded(x, positions, mask)
        args, kwargs = slot.put(*fresh(args, kwargs), x)
        if self.makes_cache:
            if torch.is_autocast_enabled(x.device.type):
                raise NotImplementedError(no_autocast(self.model))
            self._fit_cache(module, x)
        return slot.output(module(*args, **kwargs))

    @cached_property
    def makes_cache(self) -> bool:
        """Its model makes the cache its layers keep (gpt-fast's ``setup_caches``)."""
        return self.call.makes_cache(self.model)

    @cached_property
    def keeps_cache(self) -> bool:
        """Its model keeps its layers' cache itself, written at the positions it is given
        (gpt-fast's ``setup_caches``, Meta's Llama's ``start_pos``, or any forward that changes
        a buffer or tensor attribute: Mistral's rolling cache read by ``positions``)."""
        if self.makes_cache or self.call.start is not None:
            return True
        ids = self.call.tokens(BATCH, SEQ_LEN // 2, self.seed)
        return keeps_state(self.model, self.call, ids)

    def _fit_cache(self, module: nn.Module, x: Tensor) -> None:
        """Give ``module`` (a copy of the layer) an empty cache made for x's batch, as its
        model makes it: the model's copy prepared for that batch, the layer's cache parts
        there (tensor attributes, children without parameters) copied over."""
        model = self._model(x.dtype, x.device)
        self.call.prepare(model, x.shape[0])
        made = model.get_submodule(self.path)
        for name, value in vars(made).items():
            if isinstance(value, Tensor):
                setattr(module, name, value.clone())
        for name, child in made.named_children():
            if next(child.parameters(), None) is None:
                setattr(module, name, copy.deepcopy(child))
