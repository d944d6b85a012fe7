"""A fence around the user's code: whatever it does, the doctor's output and the process survive.

Everything the doctor runs of the user's (importing and building the module, each probe, the
detection of its mask convention) runs inside ``guarded()``, which

- captures what it prints (to ``sys.stdout`` or ``sys.stderr``), so ``--json`` stays JSON;
- turns ``sys.exit()``/``exit()`` into a ``UserCodeError`` ("calls sys.exit(3)"), so the doctor's
  exit status stays its own;
- stops it after ``timeout`` seconds with a ``UserCodeError`` ("did not finish within 5 s");
- restores the process's global settings afterwards: torch's default dtype and device, grad mode,
  thread count, TF32 and matmul precision, deterministic algorithms, anomaly mode, cuDNN flags,
  the random streams (torch's CPU and CUDA generators, Python's ``random``, numpy's global one),
  the global module hooks (``register_module_forward_hook`` and the rest), and the working
  directory.

``KeyboardInterrupt`` passes through (after the settings are restored). Not covered: output
written below Python (C code writing to file descriptor 1), ``os._exit``, and a single C call
that never returns (see ``time_limit``). Threads the user code starts cannot be stopped: the
command line names those still running and exits without waiting for them
(``harness.__main__.left_running``).
"""

from __future__ import annotations

import io
import os
import random
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from functools import reduce
from typing import Any

import torch

from harness.doctor.options import TIMEOUT  # seconds per guarded block; 0 or None: none

FOREVER = 1e8  # seconds: a longer limit is none (setitimer's range ends not far beyond)


class UserCodeError(Exception):
    """The user's code exited or ran past its time limit; the message says which, in one line."""


class _Deadline(BaseException):
    """Raised by SIGALRM inside a guarded block: a BaseException, so that the ``except
    Exception`` of user code (or of the doctor's own retries) does not swallow it."""


@dataclass(frozen=True)
class Setting:
    """A global setting: how to read it and how to set it back."""

    name: str
    get: Callable[[], Any]
    set: Callable[[Any], object]


def _set_default_device(device: torch.device) -> None:
    # None, not "cpu": setting "cpu" would push a device mode that every tensor factory consults
    torch.set_default_device(None if device.type == "cpu" else device)


def _attribute(path: str) -> Setting:
    """The setting ``torch.<path>``, looked up when read or set (older torch lacks some)."""
    owner_path, _, attr = path.rpartition(".")

    def owner() -> object:
        return reduce(getattr, owner_path.split("."), torch)

    return Setting(path, lambda: getattr(owner(), attr), lambda v: setattr(owner(), attr, v))


# Precision flags: the legacy ones first, then the fp32_precision ones (torch >= 2.9) that they
# map onto, general before specific. Restored in that order, both read back as they were, even
# after code mixed the two APIs (when some legacy getters raise).
FLAGS = (
    "backends.cuda.matmul.allow_tf32",
    "backends.cudnn.allow_tf32",
    "backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
    "backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
    "backends.fp32_precision",
    "backends.cuda.matmul.fp32_precision",
    "backends.cudnn.fp32_precision",
    "backends.cudnn.conv.fp32_precision",
    "backends.cudnn.rnn.fp32_precision",
    "backends.mkldnn.fp32_precision",
    "backends.mkldnn.matmul.fp32_precision",
    "backends.mkldnn.conv.fp32_precision",
    "backends.mkldnn.rnn.fp32_precision",
    "backends.cudnn.benchmark",
    "backends.cudnn.deterministic",
    "backends.cudnn.enabled",
)


def _torch_streams() -> tuple[bytes, ...]:
    """torch's CPU generator state, then each CUDA device's (once CUDA is initialized)."""
    states = [torch.random.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states += torch.cuda.get_rng_state_all()
    return tuple(bytes(state.numpy()) for state in states)


def _set_torch_streams(states: tuple[bytes, ...]) -> None:
    as_tensors = [torch.frombuffer(bytearray(state), dtype=torch.uint8) for state in states]
    torch.random.set_rng_state(as_tensors[0])
    if len(as_tensors) > 1:
        torch.cuda.set_rng_state_all(as_tensors[1:])


def _numpy_stream() -> tuple[Any, ...] | None:
    """numpy's global generator state, comparable with ==, where numpy is imported."""
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return None
    name, keys, pos, has_gauss, cached = numpy.random.get_state()
    return name, keys.tobytes(), pos, has_gauss, cached


def _set_numpy_stream(state: tuple[Any, ...] | None) -> None:
    numpy = sys.modules.get("numpy")
    if state is None or numpy is None:
        return
    name, keys, pos, has_gauss, cached = state
    numpy.random.set_state((name, numpy.frombuffer(keys, dtype=numpy.uint32).copy(), pos,
                            has_gauss, cached))  # fmt: skip


# The process-wide module hooks torch keeps (torch.nn.modules.module), by the names it uses.
GLOBAL_HOOKS = (
    "_global_forward_pre_hooks",
    "_global_forward_hooks",
    "_global_forward_hooks_always_called",
    "_global_forward_hooks_with_kwargs",
    "_global_backward_pre_hooks",
    "_global_backward_hooks",
    "_global_is_full_backward_hook",
    "_global_buffer_registration_hooks",
    "_global_module_registration_hooks",
    "_global_parameter_registration_hooks",
)


def _global_hook(name: str) -> Setting:
    """One of torch's global hook tables (a dict, refilled in place) or flags."""
    owner = torch.nn.modules.module

    def get() -> object:
        value = getattr(owner, name)
        return tuple(value.items()) if isinstance(value, dict) else value

    def set_(value: object) -> None:
        table = getattr(owner, name)
        if isinstance(table, dict):
            table.clear()
            table.update(value)
        else:
            setattr(owner, name, value)

    return Setting(f"global module hooks ({name})", get, set_)


def _settings() -> list[Setting]:
    """The global settings a module's code can change, in the order they are restored."""
    return [
        Setting("default dtype", torch.get_default_dtype, torch.set_default_dtype),
        Setting("default device", torch.get_default_device, _set_default_device),
        Setting("grad mode", torch.is_grad_enabled, torch.set_grad_enabled),
        Setting("threads", torch.get_num_threads, torch.set_num_threads),
        Setting(
            "deterministic algorithms",
            lambda: (
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
            ),
            lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1]),
        ),
        Setting(
            "anomaly mode",
            lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
            lambda v: torch.autograd.set_detect_anomaly(v[0], check_nan=v[1]),
        ),
        *(_autocast(device) for device in ("cpu", "cuda")),
        Setting(
            "float32 matmul precision",
            torch.get_float32_matmul_precision,
            torch.set_float32_matmul_precision,
        ),
        *(_attribute(path) for path in FLAGS),
        Setting("torch random streams", _torch_streams, _set_torch_streams),
        Setting("Python random stream", random.getstate, random.setstate),
        Setting("numpy random stream", _numpy_stream, _set_numpy_stream),
        *(_global_hook(name) for name in GLOBAL_HOOKS if hasattr(torch.nn.modules.module, name)),
        Setting("working directory", os.getcwd, os.chdir),
    ]


def _autocast(device: str) -> Setting:
    """Autocast on ``device``: whether it is on, and its dtype (a module that turns it on in
    its code leaves every later computation in bfloat16)."""

    def get() -> tuple[bool, torch.dtype]:
        return torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)

    def put(value: tuple[bool, torch.dtype]) -> None:
        torch.set_autocast_enabled(device, value[0])
        torch.set_autocast_dtype(device, value[1])

    return Setting(f"{device} autocast", get, put)


UNREADABLE = object()  # a setting this torch lacks, or cannot read now: left alone


def _read(setting: Setting) -> object:
    try:
        return setting.get()
    except Exception:
        return UNREADABLE


def snapshot() -> list[tuple[Setting, object]]:
    """Every global setting with its value now."""
    return [(s, _read(s)) for s in _settings()]


def restore(saved: list[tuple[Setting, object]]) -> None:
    """Set back, in order, every setting that now differs from ``saved`` (or cannot be read)."""
    for setting, value in saved:
        if value is UNREADABLE or _read(setting) == value:
            continue
        try:
            setting.set(value)
        except Exception:  # e.g. a working directory deleted since: nothing better to do
            continue


def _can_alarm() -> bool:
    """SIGALRM is usable: a POSIX system, the main thread, and no timer of someone else's
    pending (pytest-timeout's, an enclosing guard's), which a timer of ours would replace."""
    return (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    )


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise ``_Deadline`` in the block once it has run ``seconds`` (None, 0 or inf: no limit).

    SIGALRM interrupts Python code, however it loops; it is raised again every second should the
    block swallow it. A C call that never returns (a blocking read, a deadlocked kernel) cannot
    be interrupted: it is not stopped. Without SIGALRM (Windows, a thread other than the main
    one, another timer already pending) the block runs without a limit.
    """
    if not (seconds and 0 < seconds < FOREVER) or not _can_alarm():
        yield
        return
    armed = True

    def on_alarm(signum: int, frame: object) -> None:
        if armed:
            raise _Deadline

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)


def exit_message(exc: SystemExit) -> str:
    """``calls sys.exit(3)``: what a SystemExit from the user's code is reported as."""
    return f"calls sys.exit({'' if exc.code is None else repr(exc.code)})"


@contextmanager
def guarded(timeout: float | None = TIMEOUT) -> Iterator[io.StringIO]:
    """Run user code: its prints captured (the StringIO yielded), ``sys.exit`` and running past
    ``timeout`` seconds turned into ``UserCodeError``, every global setting restored on the way
    out. Any other exception, ``KeyboardInterrupt`` included, passes through unchanged."""
    saved = snapshot()
    printed = io.StringIO()
    try:
        with redirect_stdout(printed), redirect_stderr(printed), time_limit(timeout):
            yield printed
    except SystemExit as exc:
        raise UserCodeError(exit_message(exc)) from None
    except _Deadline:
        raise UserCodeError(
            f"did not finish within {timeout:g} s (a forward that never returns?); "
            "set the limit with --timeout (timeout= in Python)"
        ) from None
    finally:
        restore(saved)
