"""The doctor's commands: ``doctor`` on anyone's attention module or model, and ``zoo`` over a
library's architectures."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from harness.cli.parser import given_options
from harness.devices import resolve_device
from harness.doctor import OPTIONS, STEPS, TIMEOUT, Config, UserCodeError, diagnose, guarded, shield
from harness.doctor.examine import called_once
from harness.doctor.findings import Diagnosis
from harness.doctor.model.call import takes_token_ids
from harness.doctor.model.diagnosis import ModelDiagnosis
from harness.doctor.model.examine import diagnose_model
from harness.doctor.reading.known import Fact
from harness.doctor.settings import declared
from harness.doctor.target import Sizes, load_object, parse_init
from harness.doctor.target import build as build_target
from harness.errors import UsageError, printable, shorten
from harness.files import check_file_destination, write_atomically
from harness.progress import Progress


@contextlib.contextmanager
def every_core() -> Iterator[None]:
    """torch on every core this process may use, then back to what it was: a diagnosis at long
    sequences multiplies large tensors (the other commands keep one thread, so that their
    numbers never depend on the core count; the doctor's verdicts hold within its floors)."""
    before = torch.get_num_threads()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(max(1, cores or 1))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def with_declared(args: argparse.Namespace) -> list[Fact]:
    """``args`` with what the nearest pyproject.toml declares for the target, where the
    command line does not say otherwise; each value taken, as a fact with its source."""
    found = declared(args.target)
    if found is None:
        return []
    given = given_options(getattr(args, "argv", []))
    taken = {name: value for name, value in found.values.items() if name not in given}
    for name, value in taken.items():
        setattr(args, name, value)
    return [Fact(name, str(value), f"declared in {found.where}") for name, value in taken.items()]


def cmd_doctor(args: argparse.Namespace) -> tuple[str, int]:
    declared_facts = with_declared(args)
    device = resolve_device(args.device)
    sizes = Sizes(args.d_model, args.heads, init=parse_init(args.init), kv_heads=args.kv_heads,
                  layers=args.layers, scale=args.scale)  # fmt: skip
    for option in ("report", "fix"):  # before any probe runs
        if getattr(args, option) is not None:
            check_file_destination(getattr(args, option), f"--{option}")
    if not args.timeout >= 0:  # NaN too
        raise UsageError("--timeout must be a number of seconds >= 0 (0: no limit)")
    values = {o.name: getattr(args, o.name) for o in OPTIONS if o.config}
    values["call"] = load_adapter(args.call, args.timeout) if args.call else None
    config = Config(**{**values, "device": str(device)})
    try:  # importing and building run the user's code too
        module = _built(args, sizes)
    except UserCodeError as exc:
        raise UsageError(f"building {shorten(args.target)} stopped: it {exc}") from None
    whole = args.model or takes_token_ids(module)
    with Progress(len(STEPS)) as bar, every_core():  # progress on stderr, on a terminal

        def progress(step: str) -> None:
            bar.step(step)
            shield.note(step)  # for the parent process, when a crash ends this one

        examine = diagnose_model if whole else diagnose
        diagnosis = examine(module, config, args.target, args.timeout, progress=progress,
                            crashed=shield.crashed())  # fmt: skip
    if isinstance(diagnosis, ModelDiagnosis):
        diagnosis.notes[:0] = [fact.text() for fact in declared_facts]
        if args.fix is not None:  # a model's fix may span code no one layer's record shows
            print("--fix: fixes are proven on one attention module, so nothing was written; "
                  "run the doctor with --fix on the class the layer table names (file.py:Class)",
                  file=sys.stderr)  # fmt: skip
    else:
        diagnosis.facts[:0] = declared_facts
        diff = ""
        if not diagnosis.healthy:
            from harness.doctor.fixes import propose  # LibCST: only where there is a fault

            with every_core():
                bare = dataclasses.replace(config, mask="none")  # a call without a mask
                fixes = propose(diagnosis, functools.partial(_rediagnosed, args, sizes, config),
                                functools.partial(_called, args, sizes, config),
                                functools.partial(_called, args, sizes, bare))  # fmt: skip
            fixes.onto(diagnosis)
            diff = fixes.diff()
        if args.fix is not None:
            write_diff(Path(args.fix), diff)
    if args.report is not None:
        try:
            write_atomically(Path(args.report), diagnosis.markdown())
        except OSError as exc:  # checked up front; this is what changed since (a full disk)
            raise UsageError(
                f"cannot write --report {shorten(args.report, quote=True)}: {exc.strerror or exc}"
            ) from None
    text = diagnosis.to_json() if args.json else printable(diagnosis.text())
    return text, diagnosis.exit_code


def _built(args: argparse.Namespace, sizes: Sizes) -> torch.nn.Module:
    """The target imported and built, with the code as it runs now, within --timeout."""
    with guarded(args.timeout):
        return build_target(load_object(args.target), sizes, args.seed)


def _rediagnosed(args: argparse.Namespace, sizes: Sizes, config: Config) -> Diagnosis:
    """The target built and diagnosed again as ``cmd_doctor`` did, with the code as it runs
    now (a fix's rewritten functions in place of the file's)."""
    return diagnose(_built(args, sizes), config, args.target, args.timeout)


def _called(args: argparse.Namespace, sizes: Sizes, config: Config,
            seq_len: int | None = None, unpadded: bool = False) -> None:  # fmt: skip
    """The target built and called once, as the probes call it (on ``seq_len`` tokens; with
    nothing padded, ``unpadded``)."""
    called_once(_built(args, sizes), config, args.timeout, seq_len, unpadded)


def write_diff(path: Path, diff: str) -> None:
    """The proven fixes as a unified diff at ``path`` (--fix); none: nothing written, said."""
    if not diff:
        print("--fix: no proven fix, so nothing was written", file=sys.stderr)
        return
    try:
        write_atomically(path, diff)
    except OSError as exc:
        raise UsageError(
            f"cannot write --fix {shorten(str(path), quote=True)}: {exc.strerror or exc}"
        ) from None


def check_expression(select: str) -> None:
    """A ``-k`` expression pytest cannot read is refused here in one line, not by pytest as
    an INTERNALERROR (pytest's own parser, where this pytest has it where it used to)."""
    try:
        from _pytest.mark.expression import Expression
    except ImportError:  # moved: pytest says it, then
        return
    try:
        Expression.compile(select)
    except Exception as exc:  # SyntaxError in pytest 9, ParseError before
        reason = getattr(exc, "msg", None) or getattr(exc, "message", None) or str(exc)
        raise UsageError(f"-k {shorten(select, quote=True)} is no pytest -k expression: "
                         f"{shorten(reason, 100)}") from None  # fmt: skip


def cmd_zoo(args: argparse.Namespace) -> str:
    check_file_destination(args.out, "--out")
    if args.select:
        check_expression(args.select)
    from harness.zoo.run import run_zoo  # imports transformers: only for this command

    return run_zoo(args.out, args.workers, args.select)


def load_adapter(target: str, timeout: float = TIMEOUT) -> Callable[..., object]:
    """The --call adapter: a function (module, x, *, positions, mask, cache), imported within
    ``timeout`` seconds (--timeout, as building the module)."""
    try:
        with guarded(timeout):
            adapter = load_object(target)
    except UserCodeError as exc:
        raise UsageError(f"loading --call {shorten(target)} stopped: it {exc}") from None
    if not callable(adapter) or isinstance(adapter, type):
        raise UsageError(f"--call {shorten(target)} is not a function")
    return with_make_cache(adapter, target)


def with_make_cache(adapter: Callable[..., object], target: str) -> Callable[..., object]:
    """The adapter with the ``make_cache`` of the file --call names, unless it has its own: a
    function imported there from elsewhere (``from model import call``) gets the named file's
    cache, not the cache of the file that defines it."""
    if getattr(adapter, "make_cache", None) is not None:
        return adapter  # its own (x_transformers.make_cache = XCache) stands
    where = target.rpartition(":")[0]
    try:
        make = load_object(f"{where}:make_cache")
    except UsageError:
        return adapter  # the named file has none
    if not callable(make):
        return adapter

    @functools.wraps(adapter)
    def called(*args: object, **kwargs: object) -> object:
        return adapter(*args, **kwargs)

    called.make_cache = make  # type: ignore[attr-defined]
    return called
