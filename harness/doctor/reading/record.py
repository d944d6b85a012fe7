"""Watch one forward: every torch operation a call runs, in order, as it ran.

A ``TorchFunctionMode`` sees each torch function, tensor method and ``torch.nn.functional`` call
the module makes (the operations inside one of them are not seen twice: the mode is off while
it runs). Each is kept as an ``Op``: its name, where each tensor argument came from (an earlier
op's result, the input, a parameter, a buffer, an attribute of a module), the constants it was
given (a ``dim``, a scale, a fill value, ``is_causal``), what it returned, and the line of the
module's own source that called it. Control flow is whatever ran; no source is parsed. The
results are kept, so that a reading can look at their values (which cells a mask fills).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import linecache
import sys
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType, FunctionType

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

# Frames in these folders are torch's or the harness's: the line an op is charged to is the
# innermost frame outside them (the module's code, or the library the module comes from).
TORCH = Path(torch.__file__).resolve().parent
# Libraries that only lay tensors out for their caller (einops' rearrange): an op they run is
# charged to the line that called them.
PLUMBING = [
    TORCH,
    *(
        Path(spec.origin).resolve().parent
        for name in ("einops",)
        if (spec := importlib.util.find_spec(name)) is not None and spec.origin
    ),
]
HARNESS = Path(__file__).resolve().parents[2]
PROJECT = HARNESS.parent
MAX_OPS = 20_000  # a forward that runs more is not read further (a whole model's loop)


@dataclass(frozen=True)
class Value:
    """One argument of an op. ``kind``: "op" (``ref`` is the op's index; ``item`` which of its
    results), "input" (``ref``: the argument's name), "parameter", "buffer" or "attribute"
    (``ref``: its dotted name), "tensor" (made before the call, elsewhere) or "constant"
    (``constant``: the Python value). A one-element tensor's value is kept in ``scalar``."""

    kind: str
    ref: int | str | None = None
    item: int = 0
    shape: tuple[int, ...] | None = None
    dtype: torch.dtype | None = None
    constant: object = None
    scalar: float | None = None

    @property
    def is_tensor(self) -> bool:
        return self.shape is not None


@dataclass
class Op:
    """One operation as it ran: ``name`` (``softmax``, ``masked_fill``, ``bmm``, ...), its
    positional ``args`` and ``kwargs``, the shapes and dtypes of its tensor results, and the
    source ``line`` ("file.py:34") and its ``code`` that called it. ``raised``: the error, for
    the op that ended the forward."""

    index: int
    name: str
    args: tuple[Value, ...]
    kwargs: dict[str, Value]
    shapes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[torch.dtype, ...] = ()
    line: str = ""
    code: str = ""
    raised: str = ""
    # the innermost caller in a file that defines one of the module's forwards, where that is
    # not ``line`` (the user's call of a library helper: ``apply_rotary_pos_emb(pos, v)``)
    own_line: str = ""
    own_code: str = ""

    def arg(self, position: int, name: str) -> Value | None:
        """The argument at ``position``, or given as ``name``."""
        if position < len(self.args):
            return self.args[position]
        return self.kwargs.get(name)

    def const(self, position: int, name: str, default: object = None) -> object:
        """A constant argument's value (``default`` when not given or not a constant)."""
        value = self.arg(position, name)
        if value is None or value.kind != "constant":
            return default
        return value.constant

    @property
    def tensors(self) -> list[Value]:
        """Its tensor arguments, positional first (those in a list, as ``cat`` takes, too)."""
        found = []
        for v in (*self.args, *self.kwargs.values()):
            if v.is_tensor:
                found.append(v)
            elif isinstance(v.constant, tuple):
                found += [item for item in v.constant if isinstance(item, Value) and item.is_tensor]
        return found

    @property
    def where(self) -> str:
        """``file.py:34`` and the line's code, for a reader."""
        return f"{self.line} `{self.code}`" if self.code else self.line

    @property
    def called_where(self) -> str:
        """The line of the module's own forward that led to this op (``where`` when the op
        ran there itself)."""
        if not self.own_line:
            return self.where
        return f"{self.own_line} `{self.own_code}`" if self.own_code else self.own_line


@dataclass
class Record:
    """Every op one call ran, and their results (``results[i]``: op i's tensors)."""

    ops: list[Op] = field(default_factory=list)
    results: list[tuple[Tensor, ...]] = field(default_factory=list)
    inputs: dict[str, Tensor] = field(default_factory=dict)
    truncated: bool = False

    def result(self, value: Value) -> Tensor | None:
        """The tensor ``value`` refers to, when it is an op's result or an input."""
        if value.kind == "op" and isinstance(value.ref, int):
            found = self.results[value.ref]
            return found[value.item] if value.item < len(found) else None
        if value.kind == "input" and isinstance(value.ref, str):
            return self.inputs.get(value.ref)
        return None

    def producer(self, value: Value | None) -> Op | None:
        """The op whose result ``value`` is."""
        if value is None or value.kind != "op" or not isinstance(value.ref, int):
            return None
        return self.ops[value.ref]

    def ancestors(self, index: int) -> set[int]:
        """Op ``index`` and every op whose result it is computed from, by index."""
        todo, seen = [index], set()
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            todo += [v.ref for v in self.ops[current].tensors
                     if v.kind == "op" and isinstance(v.ref, int)]  # fmt: skip
        return seen

    def consumers(self, index: int) -> Iterator[Op]:
        """The ops that take a result of op ``index``."""
        for op in self.ops[index + 1 :]:
            if any(v.kind == "op" and v.ref == index for v in op.tensors):
                yield op


def _flat(value: object) -> list[Tensor]:
    """The tensors in a result (a tensor, or a tuple or list of them)."""
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for item in value for t in _flat(item)]
    return []


def shown_path(filename: str) -> str:
    """A source file as a reader finds it: relative to this project for its own files (the
    same on every machine), else to the working folder when it is below it, else whole."""
    path = Path(filename)
    for root in (PROJECT, Path.cwd()):
        if path.is_absolute() and path.is_relative_to(root):
            return path.relative_to(root).as_posix()
    return filename


def source_file(where: str) -> tuple[Path, int] | None:
    """The file and line number a ``where`` (``file.py:34 `code```) names, as ``shown_path``
    showed it; None when it names no file that is there."""
    place = where.split(" `", 1)[0]
    name, sep, number = place.rpartition(":")
    if not sep or not number.isdigit():
        return None
    path = Path(name)
    for candidate in (path,) if path.is_absolute() else (PROJECT / path, Path.cwd() / path):
        if candidate.is_file():
            return candidate, int(number)
    return None


def _at(frame: FrameType) -> tuple[str, str]:
    code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return f"{shown_path(frame.f_code.co_filename)}:{frame.f_lineno}", code


def calling_line() -> str:
    """Where the module's code made the torch call a ``TorchFunctionMode`` is handling (to be
    called from its ``__torch_function__``): "file.py:34 `code`", or "" for the harness's."""
    line, code, *_ = _source_line(depth=3)
    return f"{line} `{code}`" if code else line


def _source_line(
    own: frozenset[CodeType] = frozenset(), depth: int = 2
) -> tuple[str, str, str, str]:
    """The innermost caller outside torch: "file.py:34" and its code; ("", "") for an op the
    harness itself runs (the mask it encodes, the layout it turns the input into). Then the
    innermost ``own`` forward running, when that is another frame (the line of a forward that
    called a helper). ``depth``: the frames above this one to start from (3: the caller of a
    mode's ``__torch_function__``)."""
    frame = sys._getframe(depth)
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(HARNESS):
            return "", "", "", ""
        if not any(path.is_relative_to(root) for root in PLUMBING):
            break
        frame = frame.f_back
    if frame is None:
        return "", "", "", ""
    line, code = _at(frame)
    caller = frame
    while caller is not None and caller.f_code not in own:
        if Path(caller.f_code.co_filename).is_relative_to(HARNESS):
            return line, code, "", ""
        caller = caller.f_back
    if caller is None or caller is frame:
        return line, code, "", ""
    return (line, code, *_at(caller))


def forwards(module: nn.Module) -> frozenset[CodeType]:
    """The code of ``module``'s own forward (and the forwards it inherits, which a
    ``super().forward`` runs), not its submodules': the line of the module's forward that led
    to an op run in a helper or a submodule is the one a reader edits. A decorated forward
    (``@autocast(...)``) is the code it wraps."""
    defined = (vars(cls).get("forward") for cls in type(module).__mro__)
    codes = (getattr(inspect.unwrap(f), "__code__", None) for f in defined if callable(f))
    return frozenset(code for code in codes if code is not None)


def _torch_name(func: Callable[..., object]) -> str:
    """The name of the torch function a mode is handed: its own, or for a Python function set
    in torch's place (``torch.Tensor.softmax = wrapper``, which torch hands a mode as the
    function it finds under the method's name) the name it is set under."""
    name = getattr(func, "__name__", str(func))
    if not isinstance(func, FunctionType) or (func.__module__ or "").startswith("torch"):
        return name
    for owner in (torch.Tensor, F, torch):
        found = next((key for key, value in vars(owner).items() if value is func), None)
        if found is not None:
            return found
    return name


class Recorder(TorchFunctionMode):
    """Keeps an ``Op`` for each torch call made while it is on (``with Recorder(...)``)."""

    def __init__(self, known: Mapping[int, tuple[str, str]], inputs: Mapping[str, Tensor],
                 own: frozenset[CodeType] = frozenset()) -> None:  # fmt: skip
        super().__init__()
        self.own = own  # the code of the module's forwards
        self.known = dict(known)  # id of a tensor made before the call -> (kind, name)
        self.record = Record(inputs=dict(inputs))
        for name, tensor in inputs.items():
            self.known[id(tensor)] = ("input", name)
        self.made: dict[int, tuple[int, int]] = {}  # id of a result -> (op, item)

    def value(self, arg: object) -> Value:
        if not isinstance(arg, Tensor):
            if isinstance(arg, tuple | list) and any(isinstance(a, Tensor) for a in arg):
                return Value("constant", constant=tuple(self.value(a) for a in arg))
            return Value("constant", constant=arg)
        real = not (arg.is_complex() or arg.is_meta)
        scalar = float(arg.detach().reshape(-1)[0]) if real and arg.numel() == 1 else None
        shape, dtype = tuple(arg.shape), arg.dtype
        if id(arg) in self.made:
            op, item = self.made[id(arg)]
            return Value("op", op, item, shape, dtype, scalar=scalar)
        kind, name = self.known.get(id(arg), ("tensor", None))
        return Value(kind, name, 0, shape, dtype, scalar=scalar)

    def __torch_function__(
        self,
        func: Callable[..., object],
        types: object,
        args: tuple[object, ...] = (),
        kwargs: Mapping[str, object] | None = None,
    ) -> object:
        kwargs = dict(kwargs or {})
        name = _torch_name(func)
        if name == "__get__" or len(self.record.ops) >= MAX_OPS:  # .shape, .device, ...
            self.record.truncated |= len(self.record.ops) >= MAX_OPS
            return func(*args, **kwargs)
        described = (
            tuple(self.value(a) for a in args),
            {k: self.value(v) for k, v in kwargs.items()},
        )
        line, code, own_line, own_code = _source_line(self.own)
        op = Op(len(self.record.ops), name, *described, line=line, code=code, own_line=own_line,
                own_code=own_code)  # fmt: skip
        try:
            out = func(*args, **kwargs)
        except Exception as exc:
            op.raised = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            self.record.ops.append(op)
            self.record.results.append(())
            raise
        results = tuple(_flat(out))
        if name == "__setitem__" and args and isinstance(args[0], Tensor):
            results = (args[0],)  # t[i] = v: t, written, is what later ops read
        if results:  # an op that returns no tensor (size(), dim()) is not kept
            op.shapes = tuple(tuple(t.shape) for t in results)
            op.dtypes = tuple(t.dtype for t in results)
            for item, tensor in enumerate(results):
                self.made[id(tensor)] = (op.index, item)
            self.record.ops.append(op)
            self.record.results.append(results)
        return out


def known_tensors(module: nn.Module) -> dict[int, tuple[str, str]]:
    """Every tensor ``module`` holds, by id: its parameters, buffers and tensor attributes."""
    known: dict[int, tuple[str, str]] = {}
    for prefix, sub in module.named_modules():
        for name, value in vars(sub).items():
            if isinstance(value, Tensor) and not name.startswith("_"):
                known[id(value)] = ("attribute", f"{prefix}.{name}" if prefix else name)
    for name, buffer in module.named_buffers():
        known[id(buffer)] = ("buffer", name)
    for name, parameter in module.named_parameters():
        known[id(parameter)] = ("parameter", name)
    return known


def record(module: nn.Module, call: Callable[[], object], inputs: Mapping[str, Tensor]) -> Record:
    """What ``call()`` (a call of ``module`` on ``inputs``) computes, op by op. An error ends
    the record at the op that raised it (that op is kept, with ``raised``); it is not
    passed on."""
    recorder = Recorder(known_tensors(module), inputs, forwards(module))
    try:
        with recorder:  # not under no_grad: nn.MultiheadAttention would take its fused path
            call()
    except Exception:  # the op that raised is the record's last
        pass
    return recorder.record


# Ops that decide what a tensor holds, where layout ops only reshape it: a buffer cut from a
# triangle was made where the triangle was
DECIDING = {
    "tril",
    "triu",
    "tril_",
    "triu_",
    "sqrt",
    "rsqrt",
    "pow",
    "__rpow__",
    "div",
    "__truediv__",
    "__rtruediv__",
    "mul",
    "__mul__",
    "arange",
    "tensor",
    "full",
    "ones",
}


def origin(found: Record, index: int) -> Op:
    """The op that decided what op ``index``'s result holds: itself, unless it only lays out
    (view, reshape, expand) what an earlier op made."""
    op = found.ops[index]
    for _ in range(32):
        if op.name in DECIDING:
            return op
        earlier = [v for v in op.tensors if v.kind == "op" and isinstance(v.ref, int)]
        if len(earlier) != 1:
            return op
        op = found.ops[earlier[0].ref]  # type: ignore[index]
    return op


# Where each tensor a built module holds was made, by name ("scale" -> "attn.py:23 `...`"):
# the doctor builds the modules it is given by name, watching the constructor run.
_BUILT_AT: weakref.WeakKeyDictionary[nn.Module, dict[str, str]] = weakref.WeakKeyDictionary()
_WRITTEN_AT: weakref.WeakKeyDictionary[nn.Module, dict[str, str]] = weakref.WeakKeyDictionary()
# where the class's own code called the helper that wrote it, where a helper did
_WRITTEN_FROM: weakref.WeakKeyDictionary[nn.Module, dict[str, str]] = weakref.WeakKeyDictionary()


def _methods(owner: type | None) -> frozenset[CodeType]:
    """The code of every function ``owner`` and its bases define, nn.Module's aside."""
    if owner is None:
        return frozenset()
    classes = [c for c in owner.__mro__ if c.__module__.split(".")[0] != "torch"]
    functions = (inspect.unwrap(f) for c in classes for f in vars(c).values() if callable(f))
    return frozenset(code for f in functions if (code := getattr(f, "__code__", None)))


@contextlib.contextmanager
def watching_construction(owner: type | None = None) -> Iterator[Callable[[nn.Module], None]]:
    """Record the ops a constructor (of class ``owner``, where it is one) runs; ``keep(module)``
    then notes where each tensor the module holds (parameter, buffer, attribute) was made
    (``built_at``), last written (``written_at``), and from which line of the class's own
    code a helper that wrote it was called (``written_from``)."""
    recorder = Recorder({}, {}, _methods(owner))

    def keep(module: nn.Module) -> None:
        lines, written, called = {}, {}, {}
        for tensor_id, (_, name) in known_tensors(module).items():
            if tensor_id in recorder.made:
                last = recorder.record.ops[recorder.made[tensor_id][0]]
                op = origin(recorder.record, last.index)
                if op.line:
                    lines[name] = op.where
                if last.line and _in_place(last.name):
                    written[name] = last.where
        for name, tensor in module.named_parameters():  # also through an alias (.data)
            last = _last_written(recorder.record, tensor)
            if last is not None:
                written[name] = last.where
                if last.own_line:  # a helper wrote it: the line of the class that called it
                    called[name] = last.called_where
        _BUILT_AT[module], _WRITTEN_AT[module], _WRITTEN_FROM[module] = lines, written, called

    with recorder:
        yield keep


def _last_written(found: Record, tensor: Tensor) -> Op | None:
    """The last in-place op the constructor ran on another tensor over ``tensor``'s memory
    (``w.data.normal_()``: ``.data`` is a new tensor object with the parameter's storage)."""
    where = tensor.untyped_storage().data_ptr()
    for op, results in zip(reversed(found.ops), reversed(found.results), strict=True):
        over = any(r.shape == tensor.shape and r.untyped_storage().data_ptr() == where
                   for r in results)  # fmt: skip
        if over and op.line and _in_place(op.name):
            return op
    return None


def _in_place(name: str) -> bool:
    """An op that writes into its tensor (``normal_``, ``uniform_``, ``fill_``), not a dunder."""
    return name.endswith("_") and not name.endswith("__")


def written_at(module: nn.Module, name: str) -> str:
    """Where the values of the tensor ``name`` of ``module`` were last written in place while
    the doctor built it (an init such as ``nn.init.normal_(w, std=1.0)``; "" when none)."""
    return _WRITTEN_AT.get(module, {}).get(name, "")


def written_from(module: nn.Module, name: str) -> str:
    """The line of the module's own class that called the helper which last wrote the tensor
    ``name`` while the doctor built it (BEiT's ``trunc_normal_(self.qkv.weight, std=...)``;
    "" where its own code wrote it, or the doctor did not watch)."""
    return _WRITTEN_FROM.get(module, {}).get(name, "")


def built_at(module: nn.Module, name: str) -> str:
    """Where the tensor ``name`` of ``module`` was made when the doctor built it ("" when it
    did not watch it being built)."""
    return _BUILT_AT.get(module, {}).get(name, "")
