"""Loading and building a user's attention module: ``file.py:name`` or ``package.module:name``.

``name`` is an ``nn.Module`` class or a factory returning one. Its constructor's parameters are
filled by name from a table of the names real code uses for each size (``d_model``, ``n_embd``,
``hidden_size``, ``num_attention_heads``, ``block_size``, ...). A single ``config``/``args``/``cfg``
parameter gets a config object: an instance of its annotated class built from the same table, or
an object that answers the names it knows. ``--init name=value`` sets anything else. Construction
runs under the doctor's seed, so the same command builds the same weights.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import hashlib
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from torch import nn

from harness.doctor.reading.record import watching_construction
from harness.errors import UsageError, shorten
from harness.runner import seeded


def load_object(target: str) -> object:
    """The object named by ``path/to/file.py:name`` or ``package.module:name``.

    A ``package.module`` is imported with the working directory on ``sys.path`` (first, for
    the import only), as ``python -m`` has it: the console script, whose ``sys.path`` starts
    with its own folder, finds the same modules.
    """
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise UsageError(
            f"target {shorten(target, quote=True)} must look like path/to/file.py:name or "
            "pkg.mod:name"
        )
    shown = shorten(where)
    if where.endswith(".py") or "/" in where or _is_file(Path(where)):
        path = Path(where)
        try:
            found = path.is_file()
        except (OSError, ValueError) as exc:  # a name too long, a NUL in it
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise UsageError(f"cannot read {shown}: {reason}") from None
        if not found:
            if path.is_dir():
                raise UsageError(f"{shown} is a folder; name a .py file in it (file.py:name)")
            raise UsageError(f"no such file: {shown}")
        # one name per file: a target and an adapter both named model.py are two modules, and
        # each class finds its own file's cache and rotary classes by its __module__
        digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
        module_name = f"_attention_doctor_{path.stem}_{digest}"
        loaded = _LOADED.get(module_name)
        if loaded is not None and loaded[0] == path.stat().st_mtime_ns:
            return _attribute(loaded[1], where, name)  # the same file, unchanged: one module
        loader = importlib.machinery.SourceFileLoader(module_name, str(path))  # any suffix
        spec = importlib.util.spec_from_file_location(module_name, path, loader=loader)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses and the config lookup find it by name
        sys.path.insert(0, str(path.parent.resolve()))
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[module_name]
            raise UsageError(
                f"importing {shown} failed: {type(exc).__name__}: {_first_line(exc)}"
            ) from None
        finally:
            sys.path.remove(str(path.parent.resolve()))
        _LOADED[module_name] = (path.stat().st_mtime_ns, module)
    else:
        cwd = os.getcwd()
        here = any(os.path.abspath(entry or os.curdir) == cwd for entry in sys.path)
        if not here:
            sys.path.insert(0, cwd)
        try:
            importlib.invalidate_caches()  # a module written since the last import is found
            module = importlib.import_module(where)
        except Exception as exc:
            if isinstance(exc, ModuleNotFoundError) and exc.name:  # the name may be the target's
                reason = f"No module named {shorten(exc.name, quote=True)}"
            else:
                reason = _first_line(exc)
            raise UsageError(f"cannot import {shown}: {type(exc).__name__}: {reason}") from None
        finally:
            if not here:
                sys.path.remove(cwd)
    return _attribute(module, where, name)


def _attribute(module: ModuleType, where: str, name: str) -> object:
    """``module.name``, or a UsageError naming what is missing."""
    if not hasattr(module, name):
        shown = shorten(where)
        if getattr(module, "__file__", None) is None and Path(where).is_dir():  # a namespace
            raise UsageError(f"{shown} is a folder; name a .py file in it (file.py:name)")
        raise UsageError(f"{shown} has no attribute {shorten(name, quote=True)}")
    return getattr(module, name)


# Files loaded by path in this process, by module name: (modification time, module). A target
# and its --call adapter in one file are one module, so the adapter's cache is the module's.
_LOADED: dict[str, tuple[int, ModuleType]] = {}


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False for a name no file can have (too long, a NUL in it)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _scaled_by(sizes: Sizes) -> float | int:
    """The size whose inverse square root scales the scores (Gemma's query_pre_attn_scalar):
    the head width, or where a scale is declared, the size that gives it (a whole number where
    it is one)."""
    if not sizes.scale:
        return sizes.d_model // sizes.heads
    size = 1 / sizes.scale**2
    return round(size) if abs(size - round(size)) <= 1e-6 * size else size


@dataclass(frozen=True)
class Sizes:
    """What the doctor builds a module with; ``init`` (from ``--init``) overrides any name."""

    d_model: int = 64
    heads: int = 4
    context: int = 256  # the maximum sequence length a module is built for
    init: Mapping[str, object] = field(default_factory=dict)
    kv_heads: int | None = None  # grouped K/V heads (None: half the heads, or 1 with one head)
    layers: int = 2  # a whole model's depth: two layers, so that a layer sees another's output
    vocab: int = 256  # a whole model's vocabulary
    scale: float | None = None  # the declared scale (--scale), which a config's size must give

    def __post_init__(self) -> None:
        if self.d_model < 1 or self.heads < 1 or self.d_model % self.heads:
            raise UsageError("--d-model must be a positive multiple of --heads")
        if self.kv_heads is not None and (self.kv_heads < 1 or self.heads % self.kv_heads):
            raise UsageError("--kv-heads must divide --heads")
        if self.layers < 1:
            raise UsageError("--layers must be a positive number of layers")

    @property
    def groups(self) -> int:
        """K/V heads built into a module that groups them: grouped-query attention is what
        such a module is for, so the doctor builds it grouped unless told otherwise."""
        return self.kv_heads or max(1, self.heads // 2)


# The names real constructors and config objects use for each size, and the value each gets.
D_MODEL_NAMES = (
    "d_model", "embed_dim", "dim", "n_embd", "n_embed", "hidden_size", "hidden_dim", "n_state",
    "model_dim", "query_dim", "input_dim", "d_in", "emb_dim", "embedding_dim", "embed_size",
    "n_channels", "channels", "width", "n_feat", "in_features",
)  # fmt: skip
HEADS_NAMES = (
    "heads", "n_heads", "num_heads", "n_head", "nhead", "h", "num_attention_heads", "head_count",
    "num_head", "n_heads_q", "attention_heads", "encoder_attention_heads",
    "decoder_attention_heads",
)  # fmt: skip
HEAD_DIM_NAMES = (
    "d_k", "d_v", "head_dim", "d_head", "dim_head", "head_size", "attention_head_size",
    "kv_channels", "head_dim_v", "dim_per_head", "d_kv",
)  # fmt: skip
# Sizes are set even where they have defaults, so the module has the doctor's widths; flags,
# rates and indices keep the module's own defaults.
KV_HEADS_NAMES = ("num_key_value_heads", "n_kv_heads", "kv_heads", "num_kv_heads", "n_kv_head",
                  "n_query_groups")  # fmt: skip
LAYER_COUNT_NAMES = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_decoder_layers",
                     "num_encoder_layers", "encoder_layers", "decoder_layers")  # fmt: skip
LAYER_INDEX_NAMES = ("layer_idx", "layer_id", "layer_number", "layer_index")
# Partial rotary's width in dimensions (GPT-J's and CodeGen's default 64 of a 256-wide head):
# sized with the head, as half of it, so that a partial rotary module is built partial and fits.
ROTARY_DIM_NAMES = ("rotary_dim", "rotary_ndims", "rotary_emb_dim")
# Multi-head latent attention (DeepSeek V2/V3): each head's q and k split into a part without
# positions and a rotary part, half a head each; v a head wide; q and K/V squeezed through
# ranks of half the width.
LATENT_NAMES = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank",
                "q_lora_rank")  # fmt: skip
SIZE_NAMES = frozenset(
    (*D_MODEL_NAMES, *HEADS_NAMES, *HEAD_DIM_NAMES, *KV_HEADS_NAMES, *ROTARY_DIM_NAMES,
     *LATENT_NAMES, "query_pre_attn_scalar", *LAYER_COUNT_NAMES, "vocab_size", "n_vocab",
     "vocab_size_per_layer_input", "d_latents", "num_self_attends_per_block")
)  # fmt: skip
NAMES: dict[str, Callable[[Sizes], object]] = {
    **dict.fromkeys(D_MODEL_NAMES, lambda s: s.d_model),
    **dict.fromkeys(HEADS_NAMES, lambda s: s.heads),
    **dict.fromkeys(KV_HEADS_NAMES, lambda s: s.groups),
    "num_key_value_groups": lambda s: s.heads // s.groups,  # query heads per K/V head
    **dict.fromkeys(HEAD_DIM_NAMES, lambda s: s.d_model // s.heads),
    **dict.fromkeys(ROTARY_DIM_NAMES, lambda s: s.d_model // s.heads // 2),
    **dict.fromkeys(("qk_nope_head_dim", "qk_rope_head_dim"), lambda s: s.d_model // s.heads // 2),
    "v_head_dim": lambda s: s.d_model // s.heads,
    **dict.fromkeys(("kv_lora_rank", "q_lora_rank"), lambda s: s.d_model // 2),
    "query_pre_attn_scalar": lambda s: _scaled_by(s),
    **dict.fromkeys(
        ("d_out", "dim_out", "out_dim", "output_dim", "out_features"), lambda s: s.d_model
    ),
    **dict.fromkeys(
        ("block_size", "context_length", "max_seq_len", "max_seq_length", "n_ctx",
         "max_position_embeddings", "n_positions", "max_len", "max_length", "seq_len",
         "context_size", "max_sequence_length"),
        lambda s: s.context,
    ),
    # a sliding window shorter than the probes' 8 tokens, so that it slides: its mask, its
    # rolling cache's wrap-around (a prompt of 5) and an off-by-one are probed
    "sliding_window": lambda s: 4,
    # a Mamba-2 scan's chunk (256 by default: its CPU path pads 8 tokens to a 256 x 256 chunk,
    # 2 s a forward): 4, so that 8 tokens are two chunks and the carry between them is probed
    **dict.fromkeys(("chunk_size", "mamba_chunk_size"), lambda s: 4),
    # a whole model's depth and vocabulary, and its special tokens within that vocabulary
    **dict.fromkeys(LAYER_COUNT_NAMES, lambda s: s.layers),
    **dict.fromkeys(("vocab_size", "n_vocab", "entity_vocab_size",
                     "vocab_size_per_layer_input"), lambda s: s.vocab),
    # MusicGen's decoder takes ids (B * codebooks, T): one codebook, so that ids are (B, T)
    "num_codebooks": lambda s: 1,
    # Perceiver: its latents' width and self-attention depth
    "d_latents": lambda s: s.d_model,
    "num_self_attends_per_block": lambda s: s.layers,
    "pad_token_id": lambda s: 0,
    # a mixture of experts: four experts, each token routed to two
    **dict.fromkeys(("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts"),
                    lambda s: 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_k", "moe_topk", "num_experts_per_token",
                     "n_activated_experts"), lambda s: 2),
    **dict.fromkeys(("n_group", "topk_group"), lambda s: 1),  # grouped routing: one group
    "bos_token_id": lambda s: 1,
    "eos_token_id": lambda s: 2,
    **dict.fromkeys(
        ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
         "n_inner", "ffn_dim", "mlp_dim", "d_ff", "dim_feedforward"),
        lambda s: 4 * s.d_model,
    ),
    # A required dropout rate gets a non-zero one, so dropout left on in eval mode shows.
    **dict.fromkeys(
        ("dropout", "attn_dropout", "attention_dropout", "attn_pdrop", "resid_pdrop",
         "dropout_rate", "attention_probs_dropout_prob", "hidden_dropout_prob", "p_drop",
         "dropout_p", "attn_drop", "proj_drop"),
        lambda s: 0.1,
    ),
    **dict.fromkeys(("bias", "qkv_bias", "use_bias", "batch_first"), lambda s: True),
    **dict.fromkeys(LAYER_INDEX_NAMES, lambda s: 0),
    **dict.fromkeys(("rope_theta", "rope_base", "rotary_base", "base"), lambda s: 10000.0),
    **dict.fromkeys(("layer_norm_eps", "norm_eps", "rms_norm_eps", "eps"), lambda s: 1e-5),
    **dict.fromkeys(("initializer_range",), lambda s: 0.02),
}  # fmt: skip
CONFIG_NAMES = ("config", "cfg", "args", "conf", "params", "hparams", "model_args", "opt")
CONFIG_SUFFIXES = ("Config", "Args", "Cfg", "Hparams")


def value_for(name: str, sizes: Sizes) -> object:
    """The value the doctor gives ``name``; KeyError when it knows no value for it."""
    if name in sizes.init:
        return sizes.init[name]
    return NAMES[name](sizes)


def parse_init(items: list[str]) -> dict[str, object]:
    """``["n_layer=2", "act='gelu'", "name=abc"]`` -> values: Python literals, else strings."""
    values: dict[str, object] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.isidentifier():
            raise UsageError(f"--init wants name=value, not {item[:80]!r}")
        try:
            values[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            values[name] = text
    return values


class DoctorConfig:
    """A config object for a module built from one: answers the names the doctor knows (and
    those given with --init); every other name it is asked for is recorded in ``asked``."""

    def __init__(self, sizes: Sizes, placeholders: Mapping[str, object] = {}) -> None:
        self._sizes = sizes
        self._placeholders = dict(placeholders)
        self.asked: list[str] = []

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return value_for(name, self._sizes)
        except KeyError:
            pass
        if name in self._placeholders:
            return self._placeholders[name]
        self.asked.append(name)
        raise AttributeError(name, name=name, obj=self)

    def __repr__(self) -> str:
        return f"DoctorConfig(d_model={self._sizes.d_model}, heads={self._sizes.heads})"


def _config_classes(parameter: inspect.Parameter, factory: Callable[..., object]) -> list[type]:
    """The classes a config parameter may take, likeliest first: its annotation, else the config
    classes (``*Config``, ``*Args``) that the factory's own module defines or imports, its
    namesake first (BertSelfAttention: BertConfig), then the rest (CLIPAttention: CLIPConfig,
    then CLIPTextConfig and CLIPVisionConfig, which hold its sizes)."""
    annotation = parameter.annotation
    if isinstance(annotation, type) and annotation is not inspect.Parameter.empty:
        return [] if annotation.__module__ == "builtins" else [annotation]
    home = sys.modules.get(getattr(factory, "__module__", ""), None)
    found = [
        v
        for k, v in vars(home).items()
        if isinstance(v, type) and k.endswith(CONFIG_SUFFIXES) and not issubclass(v, nn.Module)
    ] if home else []  # fmt: skip
    if len(found) <= 1:
        return found
    prefix = getattr(factory, "__name__", "")
    namesakes = [c for c in found if prefix.startswith(c.__name__.removesuffix("Config"))]
    # no namesake among several: none of them is known to be its (the doctor's own config)
    return namesakes + [c for c in found if c not in namesakes] if namesakes else []


def _typed_config(cls: type, sizes: Sizes) -> object:
    """An instance of a config class, with every field the doctor knows set by name."""
    if dataclasses.is_dataclass(cls):
        names = [f.name for f in dataclasses.fields(cls)]
    else:
        parameters = inspect.signature(cls).parameters
        names = [
            n for n, p in parameters.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        ]
        if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
            with contextlib.suppress(Exception):  # classes taking **kwargs declare fields on
                names += [n for n in vars(cls()) if n not in names]  # instances; others derive
                # theirs (head_size = n_embd // n_head) from what they take
    alike = _sized_alike(lambda n: _default(cls, n), names, sizes)
    known = {
        n: value_for(n, sizes) for n in names
        if n in sizes.init
        or (n in NAMES and not (alike and _own_default_kept(n, sizes) and _default(cls, n))
            and not isinstance(_default(cls, n), list | tuple))  # one size per stage (PVT's)
    }  # fmt: skip
    if (
        "sliding_window" in known
        and "sliding_window" not in sizes.init
        and (_default(cls, "sliding_window") is None)
    ):
        known.pop("sliding_window", None)  # no window by default (Qwen2's, NemotronH's): none
    for name, sub in _sub_configs(cls).items():  # a composite's parts at the same tiny size
        if name not in sizes.init:
            with contextlib.suppress(UsageError):  # a part that refuses the sizes: its default
                known[name] = _typed_config(sub, sizes)  # (MPT's attention config)
    if "kv_lora_rank" in names and sizes.kv_heads is None:  # latent attention: one K/V per head
        known.update({n: sizes.heads for n in KV_HEADS_NAMES if n in known and n not in sizes.init})
    extra = {n: v for n, v in sizes.init.items() if n not in known}  # --init beyond the fields
    try:
        try:
            return cls(**known, **extra)  # classes that take **kwargs (transformers' configs)
        except TypeError:
            if not extra:
                raise
        config = cls(**known)
        for name, value in extra.items():
            setattr(config, name, value)
        return config
    except Exception as exc:
        raise UsageError(
            f"cannot build its config {cls.__name__}({', '.join(known)}): "
            f"{type(exc).__name__}: {_first_line(exc)}"
        ) from None


def _default(cls: type, name: str) -> object:
    """The default a config class gives ``name`` (None when it gives none)."""
    if dataclasses.is_dataclass(cls):
        found = {f.name: f for f in dataclasses.fields(cls)}.get(name)
        return None if found is None or found.default is dataclasses.MISSING else found.default
    parameter = inspect.signature(cls).parameters.get(name)
    if parameter is not None and parameter.default is not inspect.Parameter.empty:
        return parameter.default
    with contextlib.suppress(Exception):
        return getattr(cls(), name, None)
    return None


def _sub_configs(cls: type) -> dict[str, type]:
    """A composite config's parts (transformers' ``sub_configs``: a text and a vision config),
    each by the class its default holds; empty for a plain config."""
    parts = getattr(cls, "sub_configs", None)
    if not isinstance(parts, dict) or not parts:
        return {}
    try:
        default = cls()
    except Exception:
        return {}
    found = {}
    for name in parts:
        value = getattr(default, name, None)
        if value is not None and hasattr(value, "to_dict"):  # a config object, not a dict
            found[name] = type(value)
    return found


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else ""


def _unset_config(parameter: inspect.Parameter, factory: Callable[..., object]) -> bool:
    """An optional config parameter left at None beside a config class of its own (Marian's
    ``config: MarianConfig | None = None``): a module built without it breaks when called."""
    return parameter.default is None and bool(_config_classes(parameter, factory))


def _unplaced(name: str, parameter: inspect.Parameter) -> bool:
    """A layer index left at None: a model builds every layer with its index (a cache is
    addressed by it), so the doctor builds layer 0 rather than a layer that cannot cache."""
    return name in LAYER_INDEX_NAMES and parameter.default is None


def constructor_kwargs(
    factory: Callable[..., object], sizes: Sizes, choice: int = 0
) -> dict[str, object]:
    """Keyword arguments for ``factory``, filled by parameter name; UsageError if one is left.

    A required parameter the table does not know is a usage error naming it; an optional one
    keeps its default unless --init names it. A config parameter gets the ``choice``-th of its
    candidate classes (``_config_classes``).
    """
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return {}
    kwargs: dict[str, object] = {}
    missing = []
    alike = _sized_alike(lambda n: params[n].default, params, sizes)
    for name, p in params.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        required = p.default is inspect.Parameter.empty
        if name in sizes.init:
            kwargs[name] = sizes.init[name]
        elif alike and not required and _own_default_kept(name, sizes):
            continue
        elif name in CONFIG_NAMES and (required or _unset_config(p, factory)):
            classes = _config_classes(p, factory)
            cls = classes[min(choice, len(classes) - 1)] if classes else None
            kwargs[name] = _typed_config(cls, sizes) if cls else DoctorConfig(sizes)
        elif name in NAMES and (required or name in SIZE_NAMES or _unplaced(name, p)):
            kwargs[name] = value_for(name, sizes)
        elif required:
            missing.append(name)
    if missing:
        raise UsageError(
            f"cannot build {getattr(factory, '__name__', factory)}: no value for "
            f"{', '.join(missing)}; pass --init {missing[0]}=VALUE (the doctor fills sizes by "
            "name: d_model/n_embd/hidden_size, heads/n_head/num_attention_heads, head_dim, ...)"
        )
    return kwargs


# The attention's own sizes a module's defaults keep where its width and head count are already
# the doctor's: its head width, K/V heads (unless --kv-heads), partial rotary, latent ranks and
# scale (unless --scale): built as its author sized them, and as a user reading its defaults
# declares them.
OWN_SIZES = frozenset((*HEAD_DIM_NAMES, *KV_HEADS_NAMES, *ROTARY_DIM_NAMES, *LATENT_NAMES,
                       "query_pre_attn_scalar"))  # fmt: skip


def _sized_alike(default: Callable[[str], object], names: Iterable[str], sizes: Sizes) -> bool:
    """The defaults (``default(name)``) give the width and the head count the doctor builds
    with."""
    names = list(names)
    width = [default(n) for n in names if n in D_MODEL_NAMES]
    heads = [default(n) for n in names if n in HEADS_NAMES]
    return bool(width and heads) and set(width) == {sizes.d_model} and set(heads) == {sizes.heads}


def _own_default_kept(name: str, sizes: Sizes) -> bool:
    """Whether the module's default for ``name`` stands (one of its own sizes the user did not
    declare otherwise)."""
    if name in KV_HEADS_NAMES and sizes.kv_heads is not None:
        return False
    return name in OWN_SIZES and not (name == "query_pre_attn_scalar" and sizes.scale)


def _config_reads(factory: Callable[..., object], sizes: Sizes) -> list[str]:
    """The names the factory's source reads off its config parameter (``config.name``) that the
    doctor has no value for, in order: so one message can name them all."""
    init = factory.__init__ if isinstance(factory, type) else factory
    try:
        source = inspect.getsource(init)
        params = inspect.signature(factory).parameters
    except (OSError, TypeError, ValueError):
        return []
    reads: list[str] = []
    for param in (p for p in params if p in CONFIG_NAMES):
        for found in re.findall(rf"\b{param}\.(\w+)", source):
            if found not in NAMES and found not in sizes.init and found not in reads:
                reads.append(found)
    return reads


MAX_TRIES = 20  # a config object is retried once per name it asks for and the doctor lacks


def build(obj: object, sizes: Sizes, seed: int = 0) -> nn.Module:
    """Instantiate a class or call a factory under ``seed``; any failure is a UsageError.

    A module built from a ``DoctorConfig`` that asks for names the doctor does not know is
    retried with those names set to None, to name every one of them in a single message. A
    config class that does not build it is followed by the next candidate (CLIPConfig, then
    CLIPTextConfig); the first one's error is the one reported when none does.
    """
    if isinstance(obj, nn.Module):
        return obj
    if not callable(obj):
        raise UsageError(f"{obj!r} is neither an nn.Module class nor a factory")
    first: UsageError | None = None
    for choice in range(_config_choices(obj)):
        kwargs = constructor_kwargs(obj, sizes, choice)  # a name no table knows: said at once
        try:
            owner = obj if isinstance(obj, type) else None
            with watching_construction(owner) as keep:  # where its tensors are made, to read
                module = _build(obj, kwargs, sizes, seed)
            keep(module)
            return module
        except UsageError as exc:
            first = first or exc
    assert first is not None
    raise first


def _answered(exc: Exception, missing: str | None, kwargs: dict[str, object],
              sizes: Sizes) -> bool:  # fmt: skip
    """Whether the constructor's AttributeError was a config object the doctor built (from the
    module's own class) lacking a size the doctor knows, now set on it: a class that takes
    ``**kwargs`` and declares none of them (minGPT's ``GPTConfig(vocab_size, block_size,
    **kwargs)``, whose layer reads ``config.n_embd``) is asked for them only by the code."""
    config = getattr(exc, "obj", None)
    built = any(config is v for v in kwargs.values()) and not isinstance(config, DoctorConfig)
    if missing is None or not built:
        return False
    try:
        setattr(config, missing, value_for(missing, sizes))
    except (KeyError, AttributeError, TypeError):
        return False
    return True


def _config_choices(factory: Callable[..., object]) -> int:
    """How many config classes ``build`` may try for ``factory``'s config parameter (1 when it
    has none, or takes the doctor's own config)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return 1
    unset = (inspect.Parameter.empty, None)
    found = [len(_config_classes(p, factory)) for p in params
             if p.name in CONFIG_NAMES and p.default in unset]  # fmt: skip
    return max([1, *found])


def _build(obj: Callable[..., object], kwargs: dict[str, object], sizes: Sizes,
           seed: int) -> nn.Module:  # fmt: skip
    """``obj(**kwargs)`` under ``seed``, with the retries of ``build``."""
    name = getattr(obj, "__name__", repr(obj))
    unknown: list[str] = []
    for _ in range(MAX_TRIES):
        try:
            with seeded(seed):
                module = obj(**kwargs)
            break
        except Exception as exc:
            missing = getattr(exc, "name", None) if isinstance(exc, AttributeError) else None
            if _answered(exc, missing, kwargs, sizes):
                continue  # a size its config class does not declare, set as the doctor knows it
            asked = {a for v in kwargs.values() if isinstance(v, DoctorConfig) for a in v.asked}
            if missing not in asked or missing in unknown:
                if unknown:  # a placeholder None broke it: the names are what is missing
                    break
                reason = f"{type(exc).__name__}: {_first_line(exc)}"
                raise UsageError(f"{name}(...) raised {reason}") from None
            unknown.append(missing)
            placeholders = dict.fromkeys(unknown)
            kwargs = {
                k: DoctorConfig(sizes, placeholders) if isinstance(v, DoctorConfig) else v
                for k, v in kwargs.items()
            }
    if unknown:
        unknown += [n for n in _config_reads(obj, sizes) if n not in unknown]
        raise UsageError(
            f"cannot build {name}: its config has no value for {', '.join(unknown)}; "
            f"pass --init {unknown[0]}=VALUE for each"
        )
    if not isinstance(module, nn.Module):
        raise UsageError(f"{name} returned {type(module).__name__}, not an nn.Module")
    return module
