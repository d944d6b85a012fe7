"""How to run a model on token ids: which of its forward's parameters takes the ids, the
attention mask, the positions and the cache, and where its output keeps the logits."""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from harness.doctor.stated import declared_context
from harness.errors import UsageError
from harness.inputs import generator

# The names real models give each input of their forward, most common first; only these say
# "token ids" (a layer's ``input`` or ``x`` takes hidden states).
IDS_NAMES = ("input_ids", "idx", "tokens", "token_ids", "ids")
# Names a layer's hidden states take too: a model only when it maps ids to logits
AMBIGUOUS_NAMES = ("x", "input", "inputs", "src")
MASK_NAMES = ("attention_mask", "padding_mask", "mask", "key_padding_mask")
POSITION_NAMES = ("position_ids", "positions", "pos", "input_pos")
FLAT_POSITION_NAMES = ("input_pos",)  # gpt-fast's and litgpt's: one (T,) row for the batch
CACHE_NAMES = ("past_key_values", "cache", "past", "kv_cache")
# Meta's Llama: one int, the position of the first token, its cache kept inside the model
START_NAMES = ("start_pos",)
# Methods that make the cache a model keeps inside, called with (batch, length) before a
# forward: gpt-fast's setup_caches(max_batch_size, max_seq_length), litgpt's set_kv_cache
SETUP_NAMES = ("setup_caches", "set_kv_cache")
# the sizes gpt-fast's setup_caches remembers, returning early when its cache is as large: a
# cache for a batch of 4 takes no batch of 2 (its update writes k_cache[:, :, input_pos])
SETUP_SIZES = ("max_batch_size", "max_seq_length")
LABEL_NAMES = ("targets", "labels")  # nanoGPT returns every position's logits only with targets
VOCAB_NAMES = ("vocab_size", "n_vocab", "num_tokens", "vocab")
BATCH, SEQ_LEN = 2, 8  # the model doctor's forwards: B != T, so neither passes for the other
PAD = 3  # left-padding tokens before the first sequence of a padded batch


def forward_parameters(model: nn.Module) -> Mapping[str, inspect.Parameter]:
    """The parameters of ``model.forward`` (its own, not the hooks' wrapper)."""
    return inspect.signature(model.forward).parameters


def _named(params: Mapping[str, inspect.Parameter], names: tuple[str, ...]) -> str | None:
    return next((name for name in names if name in params), None)


def takes_token_ids(model: nn.Module) -> bool:
    """A model, not a layer: it embeds tokens (an nn.Embedding somewhere inside) and its
    forward's first parameter is named for token ids, or for any input (``x``) where the
    forward maps ids to logits over its vocabulary."""
    params = [p for p in forward_parameters(model) if p not in ("self",)]
    embeds = any(isinstance(m, nn.Embedding) for m in model.modules())
    if not params or not embeds:
        return False
    if params[0] in IDS_NAMES:
        return True
    return params[0] in AMBIGUOUS_NAMES and _maps_ids_to_logits(model)


def _maps_ids_to_logits(model: nn.Module) -> bool:
    """Its forward takes token ids (B, T) and gives logits over its vocabulary, (B, T, V)
    (x-transformers' ``TransformerWrapper.forward(x)``); a layer given integers raises."""
    vocab = vocabulary(model)
    ids = token_ids(vocab, BATCH, SEQ_LEN, 0)
    try:
        with torch.no_grad():
            out = logits_of(copy.deepcopy(model).eval()(ids))
    except Exception:
        return False
    return tuple(out.shape) == (BATCH, SEQ_LEN, vocab)


def vocabulary(model: nn.Module) -> int:
    """How many token ids the model embeds: its config's vocab size, else its first
    embedding's rows."""
    config = getattr(model, "config", None)
    for source in (config, model):
        for name in VOCAB_NAMES:
            value = getattr(source, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 1:
                return value
    embedding = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    if embedding is None:
        raise UsageError(
            f"{type(model).__name__} is no model of token ids (no nn.Embedding, no vocabulary "
            "size in its config): leave out --model to diagnose it as one attention module"
        )
    return embedding.num_embeddings


def left_padded(call: ModelCall, ids: Tensor, positions: bool = True) -> dict[str, Tensor]:
    """The inputs that make the first PAD tokens of ``ids``' first sequence padding: the
    model's attention mask, and (with ``positions``, where it takes them) positions counted
    from each sequence's first real token, as generate() counts them; none for a model that
    takes no mask."""
    if call.mask is None:
        return {}
    mask = torch.ones_like(ids)
    mask[0, :PAD] = 0
    given = {"mask": mask}
    if positions and call.positions is not None:
        given["positions"] = (mask.cumsum(-1) - 1).clamp(min=0)
    return given


def _length_parameter(setup: Callable[..., object]) -> str | None:
    """The name of the cache-making method's length parameter: the one whose name says a
    length (gpt-fast's ``max_seq_length``), else its second where that has no default; None
    when it takes none (litgpt's ``set_kv_cache(batch_size, device=None, dtype=None)`` reads
    the model's own ``max_seq_length``: a length there would be its device)."""
    params = [p for p in inspect.signature(setup).parameters.values() if p.name != "self"]
    said = [p.name for p in params[1:] if "len" in p.name or "seq" in p.name]
    required = [p.name for p in params[1:2] if p.default is inspect.Parameter.empty]
    return (said or required or [None])[0]


def _setup(model: nn.Module) -> Callable[[int, int], object] | None:
    """The model's method that makes the cache it keeps (``SETUP_NAMES``), or None."""
    found = (getattr(model, name, None) for name in SETUP_NAMES)
    return next((setup for setup in found if callable(setup)), None)


def no_autocast(model: nn.Module) -> str:
    """Why a model that makes its own cache is not run under autocast, naming its method."""
    setup = getattr(_setup(model), "__name__", "its cache method")
    return (f"its cache is made in its weights' dtype ({setup}) and takes no autocast keys: "
            "such a model runs in low precision cast, not autocast")  # fmt: skip


def token_ids(vocab: int, batch: int, seq_len: int, seed: int) -> Tensor:
    """Seeded token ids (B, T) of a vocabulary of ``vocab``, away from id 0 (often padding)."""
    high = max(2, min(vocab, 1000))
    return torch.randint(1, high, (batch, seq_len), generator=generator(seed))


def state_of(model: nn.Module) -> dict[str, Tensor]:
    """Every buffer and plain tensor attribute of the model's modules (a cache kept inside:
    gpt-fast's k_cache buffers, Meta's Llama's cache_k attributes), copied."""
    found = {}
    for path, module in model.named_modules():
        tensors = dict(module.named_buffers(recurse=False))
        tensors.update({n: v for n, v in vars(module).items() if isinstance(v, Tensor)})
        found.update({f"{path}.{n}": t.detach().clone() for n, t in tensors.items()})
    return found


def restore_state(model: nn.Module, state: dict[str, Tensor]) -> None:
    """Put back the buffers and tensor attributes ``state_of`` copied (by the same names), each
    in the dtype and on the device of the tensor it replaces (the state of a float32 model put
    in its float64 copy)."""
    for path, module in model.named_modules():
        attributes = [n for n, v in vars(module).items() if isinstance(v, Tensor)]
        for name in [*module._buffers, *attributes]:
            kept, now = state.get(f"{path}.{name}"), getattr(module, name)
            if kept is None or now is None:
                continue
            kept = kept.to(now.device, now.dtype if kept.is_floating_point() else kept.dtype)
            if name in module._buffers:
                module._buffers[name] = kept.clone()
            else:
                setattr(module, name, kept.clone())


def keeps_state(model: nn.Module, call: ModelCall, ids: Tensor) -> bool:
    """A model that takes positions (input_pos, start_pos, Mistral's ``positions``) and no cache
    argument, and keeps a cache inside: a forward on ``ids`` changes a buffer or tensor
    attribute of one of its modules (on a copy). A model handed its cache (transformers') keeps
    none, whatever tensor it may store in passing."""
    if not call.takes_positions or call.cache is not None:
        return False
    model = copy.deepcopy(model)
    call.prepare(model, ids.shape[0])
    before = state_of(model)
    with torch.no_grad():
        model(**call.kwargs(ids, positions=positions_of(ids)))
    after = state_of(model)
    return any(n in after and not torch.equal(t, after[n]) for n, t in before.items())


def positions_of(ids: Tensor, start: int = 0) -> Tensor:
    """The positions (B, T) of ids that start at ``start`` in every row."""
    return torch.arange(start, start + ids.shape[1]).expand_as(ids)


def first_position(positions: Tensor | None, seq_len: int) -> int:
    """The first position of ``positions`` (B, T) where every row counts on from it, for a
    model that takes only that (``start_pos``); 0 for None; NotImplementedError otherwise."""
    if positions is None:
        return 0
    start = int(positions.reshape(-1, seq_len)[0, 0])
    if not bool((positions == torch.arange(start, start + seq_len)).all()):
        raise NotImplementedError("the model takes only the first position (start_pos)")
    return start


def logits_of(output: object) -> Tensor:
    """The logits (or, for a base model, the last hidden states) in a model's output."""
    if isinstance(output, Tensor):
        return output
    for name in ("logits", "last_hidden_state", "prediction_logits"):
        value = output.get(name) if isinstance(output, Mapping) else getattr(output, name, None)
        if isinstance(value, Tensor):
            return value
    if isinstance(output, tuple | list) and output and isinstance(output[0], Tensor):
        return output[0]
    raise UsageError(
        f"the model returned {type(output).__name__}, with no logits tensor the doctor can read "
        "(a tensor, a tuple starting with one, or an output with .logits)"
    )


@dataclass
class ModelCall:
    """The model's forward, read from its signature; how it wants its positions and whether
    it needs labels for every position's logits are learnt on the first call that shows it."""

    ids: str
    mask: str | None
    positions: str | None
    cache: str | None
    use_cache: bool  # it takes use_cache=
    vocab: int
    labels: str | None = None
    with_labels: bool = False  # its forward gives every position's logits only with labels
    flat_positions: bool = False  # it takes positions as one (T,) row (gpt-fast's input_pos)
    start: str | None = None  # it takes the first token's position as one int (start_pos)
    needs_positions: bool = False  # its forward raises without them (gpt-fast's input_pos)
    bool_mask: bool = False  # it takes its mask as booleans (x-transformers' masked_fill)
    context: int = 256  # the longest sequence its own cache is made for (``prepare``)

    @classmethod
    def of(cls, model: nn.Module) -> ModelCall:
        params = forward_parameters(model)
        ids = next(iter(params))
        known = {ids, *MASK_NAMES, *POSITION_NAMES, *CACHE_NAMES, *START_NAMES}
        needed = [
            n for n, p in params.items()
            if n not in known and p.default is p.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]  # fmt: skip
        if needed:
            raise UsageError(
                f"{type(model).__name__}.forward needs `{needed[0]}`, which the doctor cannot "
                "make from token ids: give it a default, or wrap the model in one that takes ids"
            )
        return cls(
            ids=ids,
            mask=_named(params, MASK_NAMES),
            positions=_named(params, POSITION_NAMES),
            cache=_named(params, CACHE_NAMES),
            use_cache="use_cache" in params,
            vocab=vocabulary(model),
            labels=_named(params, LABEL_NAMES),
            flat_positions=_named(params, POSITION_NAMES) in FLAT_POSITION_NAMES,
            start=_named(params, START_NAMES),
            context=declared_context(model) or cls.context,
        )

    @property
    def takes_positions(self) -> bool:
        """It takes positions, as ids (B, T) or (T,) or as the first one's (start_pos)."""
        return self.positions is not None or self.start is not None

    @staticmethod
    def makes_cache(model: nn.Module) -> bool:
        """The model makes the cache it keeps with a method of its own (``SETUP_NAMES``)."""
        return _setup(model) is not None

    def prepare(self, model: nn.Module, batch: int) -> None:
        """Make the cache a model keeps inside for ``batch`` sequences (gpt-fast's
        ``setup_caches``), empty, where it has such a method; nothing otherwise."""
        setup = _setup(model)
        if setup is None:
            return
        length = _length_parameter(setup)
        if length is None:  # it reads the model's own length
            setup(batch)
            return
        for made in SETUP_SIZES:  # gpt-fast's keeps a larger cache: made again
            if made in vars(model) and isinstance(vars(model)[made], int):
                setattr(model, made, -1)  # a plain attribute (litgpt's property rebuilds rope)
        setup(batch, **{length: self.context})

    def tokens(self, batch: int, seq_len: int, seed: int) -> Tensor:
        """Seeded token ids (B, T) of its vocabulary (``token_ids``)."""
        return token_ids(self.vocab, batch, seq_len, seed)

    def kwargs(
        self,
        ids: Tensor,
        mask: Tensor | None = None,
        positions: Tensor | None = None,
        cache: object = None,
    ) -> dict[str, Any]:
        """The keyword arguments of one forward: ids, and the mask, positions and cache where
        given (a model that takes none of them given one is a NotImplementedError)."""
        call: dict[str, Any] = {self.ids: ids}
        if self.bool_mask and mask is not None:
            mask = mask.bool()
        if self.start is not None:  # the first position, one for the batch
            call[self.start] = first_position(positions, ids.shape[1])
            positions = None
        for value, name, what in ((mask, self.mask, "an attention mask"),
                                  (positions, self.positions, "position ids"),
                                  (cache, self.cache, "a cache")):  # fmt: skip
            if value is None:
                continue
            if name is None:
                raise NotImplementedError(f"the model takes no {what}")
            call[name] = value
        if self.use_cache:
            call["use_cache"] = cache is not None
        if self.flat_positions and positions is not None:
            call[self.positions] = positions[0]  # (T,): one row for the batch
        if self.with_labels:
            call[self.labels] = ids
        return call

    def run(self, model: nn.Module, ids: Tensor, **given: Any) -> Tensor:
        """The logits (B, T, V) of one forward. A forward that returns the last position's
        only asks for labels; one that refuses (B, T) positions gets one (T,) row where it
        takes that; positions it takes neither way are a NotImplementedError where it runs
        without them (the probe that passes them is skipped)."""
        self.prepare(model, ids.shape[0])
        if self.needs_positions and "positions" not in given:
            given = {**given, "positions": positions_of(ids)}
        positions = given.get("positions")
        per_row = positions is not None and not bool((positions == positions[:1]).all())
        if self.flat_positions and per_row:
            raise NotImplementedError("the model takes one row of positions for the whole batch")
        try:
            logits = logits_of(model(**self.kwargs(ids, **given)))
        except NotImplementedError:
            raise
        except Exception as first:
            if "mask" in given and not self.bool_mask:
                return self._with_bool_mask(model, ids, given, first)
            if positions is None:
                return self._with_positions(model, ids, given, first)
            logits = self._other_positions(model, ids, given, first)
        last_only = logits.dim() >= 2 and logits.shape[1] == 1 < ids.shape[1]
        if last_only and self.labels and not self.with_labels:
            self.with_labels = True
            logits = logits_of(model(**self.kwargs(ids, **given)))
        # a decoder of fixed length (Perceiver's, one query per position it can hold): the
        # first T outputs are the input's
        return logits[:, : ids.shape[1]] if logits.dim() >= 2 else logits

    def _with_bool_mask(
        self, model: nn.Module, ids: Tensor, given: dict[str, Any], first: Exception
    ) -> Tensor:
        """After a forward with a 0/1 integer mask raised ``first``: the logits with it as
        booleans (x-transformers' ``mask``), remembered for every later forward; else the
        forward's other retries, with the integer mask."""
        self.bool_mask = True
        try:
            return self.run(model, ids, **given)
        except Exception:
            self.bool_mask = False
        if given.get("positions") is None:
            return self._with_positions(model, ids, given, first)
        return self._other_positions(model, ids, given, first)

    def _with_positions(
        self, model: nn.Module, ids: Tensor, given: dict[str, Any], first: Exception
    ) -> Tensor:
        """After a forward without positions raised ``first``: the logits with positions
        0..T-1 where the model takes them and runs so (gpt-fast's forward wants input_pos
        whatever its default says), remembered for every later forward; else ``first``."""
        if not self.takes_positions or self.needs_positions:
            raise first
        self.needs_positions = True
        try:
            return self.run(model, ids, **given)
        except Exception:
            self.needs_positions = False
            raise first from None

    def _other_positions(
        self, model: nn.Module, ids: Tensor, given: dict[str, Any], first: Exception
    ) -> Tensor:
        """After a forward with (B, T) positions raised ``first``: the logits with one (T,)
        row where the model takes that (and the rows are one); a NotImplementedError where
        it takes them neither way but runs without (litgpt wants ``set_kv_cache()`` first for
        its input_pos); else ``first``."""
        positions = given["positions"]
        if positions.dim() == 2 and not self.flat_positions:
            self.flat_positions = True  # does it take one (T,) row?
            try:
                logits = logits_of(model(**self.kwargs(ids, **given)))
            except Exception:
                self.flat_positions = False
            else:
                if bool((positions == positions[:1]).all()):
                    return logits
                raise NotImplementedError(
                    "the model takes one row of positions for the whole batch"
                ) from None
        without = {k: v for k, v in given.items() if k != "positions"}
        try:
            logits_of(model(**self.kwargs(ids, **without)))
        except Exception:
            raise first from None
        raise NotImplementedError(f"the model refuses position ids: {first}") from None
