"""Attention modules whose code misbehaves: it exits, prints, hangs, interrupts, or changes the
process's global torch settings. The doctor must survive each with its output and exit status its
own. All are correct attention otherwise (one head, no mask), so only the misbehaviour shows;
the last two are broken on purpose, for the hints the doctor gives."""

import os
import random
import signal
import sys
import tempfile
import threading
import time

import torch
import torch.nn as nn


def global_settings():
    """The global settings a module may change, read here independently of the guard (a getter
    that raises, as torch's do after code mixed its two TF32 APIs, reads as "unreadable")."""
    getters = {
        "default dtype": torch.get_default_dtype,
        "grad mode": torch.is_grad_enabled,
        "threads": torch.get_num_threads,
        "matmul precision": torch.get_float32_matmul_precision,
        "deterministic": torch.are_deterministic_algorithms_enabled,
        "anomaly": torch.is_anomaly_enabled,
        "matmul tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
        "cudnn tf32": lambda: torch.backends.cudnn.allow_tf32,
        "cudnn benchmark": lambda: torch.backends.cudnn.benchmark,
        "cwd": os.getcwd,
        "cpu autocast": lambda: (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")),
        "random stream": lambda: torch.get_rng_state().tolist(),
    }
    if hasattr(torch.backends, "fp32_precision"):  # torch >= 2.9: the new precision API
        getters["cuda matmul fp32"] = lambda: torch.backends.cuda.matmul.fp32_precision
        getters["mkldnn matmul fp32"] = lambda: torch.backends.mkldnn.matmul.fp32_precision
    values = {}
    for name, get in getters.items():
        try:
            values[name] = get()
        except RuntimeError:
            values[name] = "unreadable"
    return values


class Plain(nn.Module):
    """Correct single-head self-attention; ``misbehave(x)`` runs first in every forward."""

    def __init__(self, d_model):
        super().__init__()
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def misbehave(self, x):
        pass

    def forward(self, x):
        self.misbehave(x)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        weights = (q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5).softmax(-1)
        return weights @ v


class ExitsInForward(Plain):
    def misbehave(self, x):
        sys.exit(0)


class ExitsWithMask(Plain):
    """Takes a mask, so the doctor first calls it to detect the mask's convention."""

    def forward(self, x, mask=None):
        sys.exit(0)


class ExitsOnLongInputs(Plain):
    """Exits only on sequences longer than the doctor's first calls (3 tokens)."""

    def misbehave(self, x):
        if x.shape[1] > 3:
            exit()


class ExitsInInit(Plain):
    def __init__(self, d_model):
        sys.exit(3)


class CrashesUnderAutocast(Plain):
    """Dies of SIGSEGV, as a fault in native code does, when run under autocast (the low
    precision probes) and only then."""

    def misbehave(self, x):
        if torch.is_autocast_enabled("cpu"):
            os.kill(os.getpid(), signal.SIGSEGV)


class CrashesInForward(Plain):
    def misbehave(self, x):
        os.kill(os.getpid(), signal.SIGSEGV)


class Prints(Plain):
    def __init__(self, d_model):
        print("building Prints")
        print("a warning of mine", file=sys.stderr)
        super().__init__(d_model)

    def misbehave(self, x):
        print("forward called with", tuple(x.shape))


class ChangesGlobals(Plain):
    """Changes every global setting the doctor restores in every forward (and when built)."""

    def __init__(self, d_model, when_built=True):
        super().__init__(d_model)
        if when_built:
            self.misbehave(None)

    def misbehave(self, x):
        torch.set_default_dtype(torch.float64)
        torch.set_grad_enabled(False)
        torch.set_num_threads(7)
        torch.set_float32_matmul_precision("medium")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.autograd.set_detect_anomaly(True)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
        torch.set_autocast_enabled("cpu", True)
        torch.set_autocast_dtype("cpu", torch.float16)
        torch.manual_seed(1234)
        os.chdir(tempfile.gettempdir())


class Hangs(Plain):
    def misbehave(self, x):
        while True:
            pass


class HangsSwallowingErrors(Plain):
    """Never returns, and swallows every Exception on the way."""

    def misbehave(self, x):
        while True:
            try:  # noqa: SIM105 - written as user code is
                sum(range(1000))
            except Exception:
                pass


class HangsOnLongInputs(Plain):
    """Hangs only on sequences longer than the doctor's first calls (3 tokens)."""

    def misbehave(self, x):
        if x.shape[1] > 3:
            while True:
                pass


class Interrupted(Plain):
    """Ctrl-C while it runs: SIGINT to its own process."""

    def misbehave(self, x):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the signal arrives first


class Reseeds(Plain):
    """Reseeds every random stream and registers a global forward hook in every forward."""

    def misbehave(self, x):
        torch.manual_seed(1234)
        random.seed(1234)
        torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: None)


class StartsThread(Plain):
    """Starts a thread that outlives the doctor (not a daemon; it ends by itself in 120 s)."""

    def __init__(self, d_model):
        super().__init__(d_model)
        threading.Thread(target=time.sleep, args=(120,), name="left-running").start()


class ChangesItsInput(Plain):
    """Correct attention, but it scales its input tensor in place first."""

    def misbehave(self, x):
        x.mul_(2)


class AllNaN(Plain):
    """Every output NaN (a mask turned into NaN by (1 - keep) * -inf, say)."""

    def forward(self, x):
        return super().forward(x) * float("nan")


class EndsTheProcess(Plain):
    """Leaves the process on its first call with a status of 0: a doctor that took the
    process's status for its verdict would call it healthy."""

    def misbehave(self, x):
        os._exit(0)


class Fatal(BaseException):
    """Not an Exception: what ``except Exception`` lets through."""


class RaisesABaseException(Plain):
    def misbehave(self, x):
        raise Fatal("\x1b[31mred\x1b[0m")


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no message")


class RaisesAnUnprintableError(Plain):
    def misbehave(self, x):
        raise Unprintable()


class RaisesInColour(Plain):
    """An error message with a terminal's escape codes in it."""

    def misbehave(self, x):
        raise RuntimeError("\x1b[2J\x1b[31mscreen cleared\x1b[0m")


class ForksASleeper(Plain):
    """Forks a process that sleeps ten minutes, on every call: none may outlive the doctor."""

    def misbehave(self, x):
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)


class IgnoresStopSignals(Plain):
    """Ignores SIGINT and SIGTERM, then never returns."""

    def misbehave(self, x):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            pass


class RaisesInColourWhenBuilt(Plain):
    def __init__(self, d_model):
        raise ValueError("\x1b[2J\x1b[31mscreen cleared\x1b[0m")
