"""The command line: list, show, diff, run, learn and report the catalogue; doctor your own
module.

Bad input (an unknown id, an absent device, a dtype the device cannot run) is reported as one
line on stderr with exit status 2, before any work is done and without writing anything.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import re
import signal
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pandas as pd
import torch

from harness import __version__, interrupts
from harness.catalogue import registry
from harness.catalogue.card import Card, Pair
from harness.catalogue.diffing import unified_diff
from harness.catalogue.judge import Grid, Measurement, measure_grid
from harness.catalogue.learn import learn
from harness.devices import DTYPES, available_devices, resolve_device, resolve_dtype
from harness.doctor import (
    OPTIONS,
    STEPS,
    TIMEOUT,
    Config,
    UserCodeError,
    diagnose,
    guarded,
    shield,
)
from harness.doctor.model.call import takes_token_ids
from harness.doctor.model.examine import diagnose_model
from harness.doctor.options import Option
from harness.doctor.target import Sizes, load_object, parse_init
from harness.doctor.target import build as build_target
from harness.errors import Interrupted, UsageError, shorten
from harness.files import check_file_destination, created_by, ensure_writable, write_atomically
from harness.inputs import check_seed
from harness.interrupts import stop_signals, uninterrupted
from harness.learning import STEPS as LEARN_STEPS
from harness.learning import Learning
from harness.progress import Progress
from harness.report import publish
from harness.report.build import build_report
from harness.report.store import Store, default_folder
from harness.report.workers import available_cores

PROG = "python -m harness"


class Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(shorten_echoes(message))


# What argparse echoes of the command line: a quoted value ('...' or "...", as repr writes it),
# or the words after "unrecognized arguments:".
QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
UNRECOGNIZED = "unrecognized arguments: "


def shorten_echoes(message: str, limit: int = 60) -> str:
    """argparse's ``message`` with each long value it echoes cut (``harness.errors.shorten``)."""
    head, found, rest = message.partition(UNRECOGNIZED)
    if found:
        return head + found + shorten(rest, limit)

    def cut(match: re.Match[str]) -> str:  # 'aaaa…' (100000 characters), as shorten writes it
        text = match[0]
        if len(text) <= limit + 2:
            return text
        return f"{text[: limit + 1]}{text[0]}… ({len(text) - 2} characters)"

    return QUOTED.sub(cut, message)


def build_parser() -> Parser:
    parser = Parser(prog=PROG, description="Measure hand-written attention traps.")
    parser.add_argument("--version", action="version", version=f"attention-pitfalls {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    sub.add_parser("list", help="one line per trap")
    show = sub.add_parser("show", help="a trap's card, then its diff")
    show.add_argument("id")
    diff = sub.add_parser("diff", help="unified diff of buggy.py against fixed.py")
    diff.add_argument("id")
    diff.add_argument("--color", choices=["auto", "always", "never"], default="auto")
    run = sub.add_parser("run", help="measure traps and print their verdicts")
    run.add_argument("ids", nargs="*", metavar="ID", help="trap ids (default: all)")
    add_grid_options(run)
    run.add_argument("--format", choices=["md", "csv", "json"], default="md")
    learn = sub.add_parser(
        "learn",
        help="train fixed.py and buggy.py on a tiny task and say what the bug does to learning",
        description=(
            "Train a trap's fixed.py and buggy.py from the same weights on the same batches "
            "inside a tiny model (recall for bidirectional modules, copying for causal ones), "
            "print steps to 90%, losses and accuracies (teacher-forced and by generation), and "
            "name what the bug does to learning; write each trap's curves as ID.csv and ID.png."
        ),
    )
    learn.add_argument("ids", nargs="*", metavar="ID", help="trap ids (default: all)")
    learn.add_argument(
        "--steps", type=positive, default=LEARN_STEPS, help=f"training steps ({LEARN_STEPS})"
    )
    learn.add_argument("--seed", type=seed, default=0, help="seed for weights and batches (0)")
    learn.add_argument("--device", default="cpu", help="cpu or cuda (cpu)")
    learn.add_argument(
        "--out",
        type=Path,
        default=Path("reports/learning"),
        help="folder for each trap's curves, ID.csv and ID.png (default: reports/learning/)",
    )
    report = sub.add_parser("report", help="write the markdown diagnosis report")
    add_grid_options(report)
    report.add_argument("--out", type=Path, default=Path("reports"), help="default: reports/")
    report.add_argument(
        "--no-learn", action="store_true", help="skip the learning probe (its column and curves)"
    )
    report.add_argument(
        "--workers", type=positive, default=None,
        help="processes for the traps and the doctor's tables (default: the cores available; "
        "the report's bytes do not depend on it)",
    )  # fmt: skip
    report.add_argument(
        "--no-store", action="store_true",
        help="measure everything again and keep nothing (default: reuse what an earlier run "
        "measured from the same inputs, kept in $ATTENTION_PITFALLS_CACHE, else "
        "~/.cache/attention-pitfalls)",
    )  # fmt: skip
    add_doctor_parser(sub)
    zoo = sub.add_parser(
        "zoo",
        help="the model doctor over every text architecture of the installed transformers, "
        "and over injected bugs (a benchmark: minutes)",
    )
    zoo.add_argument("library", choices=["transformers"], help="whose architectures")
    zoo.add_argument("--out", type=Path, default=Path("reports/zoo.md"),
                     help="the table (default: reports/zoo.md)")  # fmt: skip
    zoo.add_argument("--workers", default="auto", help="processes (pytest-xdist -n; auto)")
    zoo.add_argument("-k", dest="select", default="",
                     help="only the cases matching this pytest -k expression")  # fmt: skip
    return parser


def add_doctor_parser(sub: argparse._SubParsersAction) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="diagnose your own attention module",
        description="Run black-box probes on a self-attention module: exit 0 healthy "
        "(warnings allowed), 1 a probe failed, 2 usage error.",
    )
    doctor.add_argument("target", help="path/to/file.py:name or package.module:name")
    for option in OPTIONS:  # the one table: Config and the fixture's documentation use it too
        doctor.add_argument(option.flag, **argparse_form(option))


def argparse_form(option: Option) -> dict[str, object]:
    """``add_argument``'s keywords for one option of the table."""
    help_text = option.help.replace("%", "%%")  # argparse formats help with %
    if option.kind == "flag":
        return {"action": "store_true", "help": help_text}
    form: dict[str, object] = {"default": option.default, "help": help_text}
    if option.kind == "choice":
        form["choices"] = option.choices
    else:
        form["type"] = OPTION_TYPES[option.kind]
    if option.metavar:
        form["metavar"] = option.metavar
    if option.repeat:
        form.update(action="append", default=[])
    return form


def add_grid_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device", action="append", help="cpu or cuda; repeatable (default: every available)"
    )
    parser.add_argument(
        "--dtype",
        action="append",
        choices=list(DTYPES),
        help="repeatable (default: float32, bfloat16, float16)",
    )


def resolve_grid(args: argparse.Namespace) -> Grid:
    """Every (device, dtype) asked for, validated up front."""
    names = args.device or available_devices()
    devices = list(dict.fromkeys(resolve_device(d) for d in names))  # cpu:0 is cpu: once
    dtypes = list(dict.fromkeys(args.dtype or DTYPES))
    return [(dev, resolve_dtype(name, dev)) for dev in devices for name in dtypes]


def resolve_pairs(ids: Sequence[str]) -> list[Pair]:
    try:
        return [registry.load(i) for i in dict.fromkeys(ids)] if ids else registry.load_all()
    except registry.UnknownPitfall as exc:
        hint = f"; {exc.suggestion}" if exc.suggestion else ""
        raise UsageError(
            f"unknown pitfall {shorten(exc.pitfall_id, quote=True)}{hint} ({PROG} list shows all)"
        ) from None


def summary_table(measurements: list[Measurement]) -> pd.DataFrame:
    """One row per measurement, with the card's expected verdict beside the measured one."""
    rows = []
    for m in measurements:
        row = m.summary()
        row["expected"] = str(registry.load(m.pitfall).card.expected)
        rows.append(row)
    columns = [
        "pitfall", "device", "dtype", "verdict", "expected", "err_bug", "floor", "threshold",
        "entropy_fix", "entropy_bug", "grad_cosine_min", "trigger", "reason",
    ]  # fmt: skip
    return pd.DataFrame(rows)[columns]


LIST_HEADER = ("id", "§", "category", "expected")


def cmd_list(args: argparse.Namespace) -> str:
    """A header row, then one aligned row per trap."""
    rows = [LIST_HEADER] + [
        (p.card.id, p.card.section, p.card.category, str(p.card.expected))
        for p in registry.load_all()
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(LIST_HEADER) - 1)]
    return "\n".join(
        "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]])
        for row in rows
    )


def card_text(card: Card) -> str:
    """The card in words."""
    wrap = textwrap.TextWrapper(width=96, initial_indent="  ", subsequent_indent="  ")
    parts = [
        f"{card.id}: {card.title}",
        f"tutorial section {card.section} | category {card.category} | "
        f"expected verdict {card.expected}",
    ]
    for label, text in (
        ("The tutorial says", card.claim),
        ("The trap", card.trap),
        ("What is true (measured)", card.truth),
        ("Why it matters", card.why),
        ("How to avoid it", card.avoid),
    ):
        parts += ["", f"{label}:", wrap.fill(text)]
    setup = [f"mask: {card.mask} ({card.convention})", f"shape: {card.shape.label()}"]
    setup.append("weights: shared" if card.shared_weights else "weights: compared over seeds")
    if card.edge == "large":
        setup.append(f"then large activations (x scaled by {card.input_scale:g})")
    elif card.edge == "empty_row":
        setup.append("then a sequence that is all padding")
    parts += ["", "Measured with: " + "; ".join(setup)]
    if card.sources:
        parts.append("Sources: " + ", ".join(card.sources))
    return "\n".join(parts)


def colour_diff(diff: str) -> str:
    colours = {"+": "\033[32m", "-": "\033[31m", "@": "\033[36m"}
    lines = []
    for line in diff.splitlines():
        colour = colours.get(line[:1]) if not line.startswith(("+++", "---")) else "\033[1m"
        lines.append(f"{colour}{line}\033[0m" if colour else line)
    return "\n".join(lines)


def cmd_show(args: argparse.Namespace) -> str:
    pair = resolve_pairs([args.id])[0]
    return card_text(pair.card) + "\n\n" + unified_diff(pair.folder).rstrip("\n")


def cmd_diff(args: argparse.Namespace) -> str:
    pair = resolve_pairs([args.id])[0]
    diff = unified_diff(pair.folder).rstrip("\n")
    colour = args.color == "always" or (
        args.color == "auto" and sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    )  # NO_COLOR set and not empty: no colour unless asked for (https://no-color.org)
    return colour_diff(diff) if colour else diff


def cmd_run(args: argparse.Namespace) -> str:
    pairs = resolve_pairs(args.ids)
    grid = resolve_grid(args)
    with Progress(len(pairs) * len(grid)) as bar:  # on a terminal
        table = summary_table(measure_grid(pairs, grid, bar.step))
    if args.format == "csv":
        return table.to_csv(index=False).rstrip("\n")
    if args.format == "json":  # JSON has no Inf: keep it apart from null (not measured)
        finite = table.astype(object).replace({math.inf: "inf", -math.inf: "-inf"})
        return finite.to_json(orient="records", indent=2, double_precision=15)
    return table.to_markdown(index=False, floatfmt=".3g")


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


def cmd_doctor(args: argparse.Namespace) -> tuple[str, int]:
    device = resolve_device(args.device)
    sizes = Sizes(args.d_model, args.heads, init=parse_init(args.init), kv_heads=args.kv_heads,
                  layers=args.layers)  # fmt: skip
    if args.report is not None:  # before any probe runs
        check_file_destination(args.report, "--report")
    if not args.timeout >= 0:  # NaN too
        raise UsageError("--timeout must be a number of seconds >= 0 (0: no limit)")
    values = {o.name: getattr(args, o.name) for o in OPTIONS if o.config}
    values["call"] = load_adapter(args.call, args.timeout) if args.call else None
    config = Config(**{**values, "device": str(device)})
    try:  # importing and building run the user's code too
        with guarded(args.timeout):
            module = build_target(load_object(args.target), sizes, args.seed)
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
    if args.report is not None:
        try:
            write_atomically(Path(args.report), diagnosis.markdown())
        except OSError as exc:  # checked up front; this is what changed since (a full disk)
            raise UsageError(
                f"cannot write --report {shorten(args.report, quote=True)}: {exc.strerror or exc}"
            ) from None
    return (diagnosis.to_json() if args.json else diagnosis.text()), diagnosis.exit_code


def cmd_zoo(args: argparse.Namespace) -> str:
    check_file_destination(args.out, "--out")
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


MAX_STEPS = 1_000_000  # learn --steps: 120 take seconds; more than this never ends in practice


def positive(text: str) -> int:
    """argparse type: an integer of at least 1 (and at most ``MAX_STEPS``: it counts steps)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {shorten(text, quote=True)}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    if value > MAX_STEPS:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_STEPS:,}, not {shorten(value)} (the default is {LEARN_STEPS})"
        )
    return value


def seed(text: str) -> int:
    """argparse type: a seed, an integer in 0..2**32 - 1 (``inputs.check_seed``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {shorten(text, quote=True)}") from None
    try:
        return check_seed(value)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def scale(text: str) -> float:
    """argparse type: a positive factor on the scores, or none (unscaled: 1.0)."""
    if text.strip().lower() == "none":
        return 1.0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(
            f"a positive number or none, not {shorten(text, quote=True)}"
        )
    return value


# How each kind of option in the doctor's table is parsed (flags and choices by argparse).
OPTION_TYPES: dict[str, Callable[[str], object]] = {
    "int": int, "float": float, "text": str, "seed": seed, "scale": scale,
}  # fmt: skip


def learning_text(pair: Pair, learning: Learning, steps: int, seed: int) -> str:
    """One trap's learning probe: the task, the table, what the bug does, and any caveat."""
    d = learning.diagnosis
    lines = [
        f"{pair.card.id}: {learning.task.describe()}; {steps} steps, seed {seed}",
        "",
        learning.table().to_markdown(index=False, floatfmt=".3g", missingval="n/a"),
        "",
        f"buggy.py: {d.label}: {d.evidence}",
    ]
    return "\n".join(lines + ([learning.note] if learning.note else []))


def cmd_learn(args: argparse.Namespace) -> str:
    pairs = resolve_pairs(args.ids)
    device = resolve_device(args.device)
    names = [name for pair in pairs for name in curve_files(pair.card.id)]
    created = ensure_writable(args.out, files=names, folders=())
    texts = []
    with created_by(created), publish.staging(args.out) as staged:
        with Progress(len(pairs)) as bar:
            for pair in pairs:
                bar.step(f"training {pair.card.id}")
                learning = learn(pair, seed=args.seed, device=device, steps=args.steps)
                texts.append(learning_text(pair, learning, args.steps, args.seed))
                write_curves(staged, pair.card.id, learning)
        interrupts.ACTIVE.check()  # a Ctrl-C that matplotlib's clean-up swallowed stops here
        written = [args.out / name for name in names]
        with publish.locked(args.out), uninterrupted("wrote " + ", ".join(map(str, written))):
            for name in names:  # a link in the way is replaced, never written through
                os.replace(staged / name, args.out / name)
    return "\n\n".join(texts) + "\n\nwrote " + ", ".join(str(p) for p in written)


def curve_files(trap: str) -> tuple[str, str]:
    """The files ``learn`` writes for a trap: its curves as a table and as a picture."""
    return f"{trap}.csv", f"{trap}.png"


def write_curves(folder: Path, trap: str, learning: Learning) -> None:
    """``folder/<trap>.csv`` (loss and accuracy per step) and ``folder/<trap>.png``, into a
    run's own staging folder (``publish.staging``), which nothing else writes."""
    csv, png = curve_files(trap)
    (folder / csv).write_text(learning.curves().to_csv(index=False))
    from harness.report.pictures import learning_plot  # matplotlib, for this command only

    learning_plot(folder / png, trap, learning)


def cmd_report(args: argparse.Namespace) -> str:
    kept = Store(None if args.no_store else default_folder())
    workers = args.workers or available_cores()
    return build_report(resolve_grid(args), args.out, not args.no_learn, kept, workers)


COMMANDS = {
    "list": cmd_list,
    "show": cmd_show,
    "diff": cmd_diff,
    "run": cmd_run,
    "learn": cmd_learn,
    "report": cmd_report,
    "doctor": cmd_doctor,
    "zoo": cmd_zoo,
}


def interrupted(signum: int, done: Sequence[str] = ()) -> int:
    """Say so in one line, with what the command had already changed for good (nothing, unless
    ``done`` says); the exit status a shell gives a process stopped by ``signum``."""
    stop = Interrupted(signum)
    name = "" if signum == signal.SIGINT else f" ({stop.signal_name})"
    after = f", after it had finished: {'; '.join(done)}" if done else ""
    print(f"{PROG}: interrupted{name}{after}", file=sys.stderr)
    return stop.exit_status


def main(argv: Sequence[str] | None = None) -> int:
    torch.set_num_threads(1)  # tiny tensors: faster, and the numbers never depend on core count
    with stop_signals() as signals:
        try:
            try:
                args = build_parser().parse_args(argv)
            except SystemExit as exc:  # --version, --help: printed, and argparse exits 0
                return exc.code if isinstance(exc.code, int) else 0
            result = COMMANDS[args.command](args)
            text, code = result if isinstance(result, tuple) else (result, 0)
            signals.check()  # interrupted, but its exception was swallowed on the way
            print(text)
            return code
        except UsageError as exc:
            signals.quiet = True
            if signals.received:
                return interrupted(signals.received[0], signals.done)
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as exc:
            signals.quiet = True
            received = signals.received
            signum = received[0] if received else getattr(exc, "signum", signal.SIGINT)
            return interrupted(signum, signals.done)
        except BrokenPipeError:  # e.g. piped into head: not an error of ours
            signals.quiet = True
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's final flush quiet
            return 0
