"""The command line's words: every command, option and argument, parsed and checked before any
work starts. Imports nothing heavy (the option tables and the default names are light), so that
a command is understood, or refused in one line, in milliseconds."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from harness import __version__
from harness.defaults import DTYPE_NAMES, LEARN_STEPS
from harness.doctor.options import GROUPS, OPTIONS, RETIRED, Option
from harness.errors import UsageError, shorten

PROG = "python -m harness"


class Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        echoed = message.partition(UNRECOGNIZED)[2].split()
        retired = [f"{flag} is gone: say {now}" for flag, now in RETIRED.items() if flag in echoed]
        raise UsageError(shorten_echoes(message) + "".join(f" ({said})" for said in retired))


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
    compare = sub.add_parser(
        "compare",
        help="two reports: what differs beyond rounding and chance (exit 1 when they disagree)",
        description="Compare two report folders as the committed report is compared with a "
        "fresh run: the same words, numbers within both reports' thresholds, learning tallies "
        "within Fisher's exact test (equal on the same machine). Exit 0 agree, 1 disagree, "
        "2 usage error.",
    )
    compare.add_argument("old", type=Path, help="a report folder (or its report.md)")
    compare.add_argument("new", type=Path, help="another")
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
    groups = {key: doctor.add_argument_group(title) for key, title in GROUPS.items()}
    for option in OPTIONS:  # the one table: Config and the fixture's documentation use it too
        groups[option.group].add_argument(option.flag, **argparse_form(option))


def given_options(argv: Sequence[str]) -> set[str]:
    """The doctor's options that ``argv`` gives on the command line (as argparse reads them,
    abbreviations included), whatever their values."""
    parser = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    for option in OPTIONS:
        form = {k: v for k, v in argparse_form(option).items() if k != "default"}
        parser.add_argument(option.flag, **form)
    try:
        known, _ = parser.parse_known_args(list(argv))
    except SystemExit:  # the real parser has already accepted argv: this cannot fail
        return set()
    return set(vars(known))


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
        choices=list(DTYPE_NAMES),
        help="repeatable (default: float32, bfloat16, float16)",
    )


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
    from harness.inputs import check_seed  # torch: only when a seed is given

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
