"""Loading a user's attention module for the doctor: ``file.py:name`` or ``package.module:name``.

``name`` is an ``nn.Module`` class or a factory returning one. Its parameters are filled by name
from the doctor's sizes (d_model, heads, head width); anything it cannot fill is a usage error.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path

from torch import nn

from harness.errors import UsageError

# Parameter names a constructor may use for each size the doctor knows.
D_MODEL_NAMES = ("d_model", "embed_dim", "dim", "n_embd", "hidden_size", "d_in", "emb_dim")
HEADS_NAMES = ("heads", "n_heads", "num_heads", "n_head", "nhead", "h")
HEAD_DIM_NAMES = ("d_k", "d_v", "head_dim", "d_head", "dim_head")
BOOL_TRUE_NAMES = ("batch_first",)


def load_object(target: str) -> object:
    """The object named by ``path/to/file.py:name`` or ``package.module:name``."""
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise UsageError(f"target {target!r} must look like path/to/file.py:name or pkg.mod:name")
    if where.endswith(".py") or "/" in where or Path(where).is_file():
        path = Path(where)
        if not path.is_file():
            raise UsageError(f"no such file: {where}")
        module_name = f"_attention_doctor_{path.stem}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(path.parent.resolve()))
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise UsageError(f"importing {where} failed: {type(exc).__name__}: {exc}") from None
        finally:
            sys.path.remove(str(path.parent.resolve()))
    else:
        try:
            module = importlib.import_module(where)
        except Exception as exc:
            raise UsageError(f"cannot import {where}: {type(exc).__name__}: {exc}") from None
    if not hasattr(module, name):
        raise UsageError(f"{where} has no attribute {name!r}")
    return getattr(module, name)


def constructor_kwargs(
    factory: Callable[..., object], d_model: int, heads: int
) -> dict[str, object]:
    """Keyword arguments for ``factory``, filled by parameter name; UsageError if one is left."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return {}
    kwargs: dict[str, object] = {}
    missing = []
    for name, p in params.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name in D_MODEL_NAMES:
            kwargs[name] = d_model
        elif name in HEADS_NAMES:
            kwargs[name] = heads
        elif name in HEAD_DIM_NAMES:
            kwargs[name] = d_model // heads
        elif name in BOOL_TRUE_NAMES and p.default is inspect.Parameter.empty:
            kwargs[name] = True
        elif p.default is inspect.Parameter.empty:
            missing.append(name)
    if missing:
        raise UsageError(
            f"cannot build {getattr(factory, '__name__', factory)}: no value for "
            f"{', '.join(missing)} (the doctor fills d_model/embed_dim/dim, heads/num_heads and "
            "d_k/head_dim by name; wrap it in a factory that takes no arguments)"
        )
    return kwargs


def build(obj: object, d_model: int, heads: int) -> nn.Module:
    """Instantiate a class or call a factory, turning any failure into a UsageError."""
    if isinstance(obj, nn.Module):
        return obj
    if not callable(obj):
        raise UsageError(f"{obj!r} is neither an nn.Module class nor a factory")
    kwargs = constructor_kwargs(obj, d_model, heads)
    try:
        module = obj(**kwargs)
    except Exception as exc:
        name = getattr(obj, "__name__", repr(obj))
        raise UsageError(f"{name}(...) raised {type(exc).__name__}: {exc}") from None
    if not isinstance(module, nn.Module):
        raise UsageError(f"{getattr(obj, '__name__', obj)} returned {type(module).__name__}, "
                         "not an nn.Module")  # fmt: skip
    return module
