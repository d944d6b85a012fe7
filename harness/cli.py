"""The command line: list, show, diff, run and report the catalogue; doctor your own module.

Bad input (an unknown id, an absent device, a dtype the device cannot run) is reported as one
line on stderr with exit status 2, before any work is done and without writing anything.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch

from harness.catalogue import registry
from harness.catalogue.card import Card, Pair
from harness.catalogue.diffing import unified_diff
from harness.catalogue.judge import Measurement, measure
from harness.devices import (
    DEVICE_KINDS,
    DTYPES,
    available_devices,
    dtype_name,
    resolve_device,
    resolve_dtype,
)
from harness.doctor import (
    MASK_SHAPES,
    MASKS,
    STEPS,
    TIMEOUT,
    Config,
    UserCodeError,
    diagnose,
    guarded,
)
from harness.doctor.target import Sizes, load_object, parse_init
from harness.doctor.target import build as build_target
from harness.errors import UsageError
from harness.files import ensure_writable, write_atomically
from harness.progress import Progress
from harness.realmodules import real_markdown, real_table
from harness.report import collect, write_report
from harness.validation import detection_markdown, detection_table

PROG = "python -m harness"


class Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def build_parser() -> Parser:
    parser = Parser(prog=PROG, description="Measure hand-written attention traps.")
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
    report = sub.add_parser("report", help="write the markdown diagnosis report")
    add_grid_options(report)
    report.add_argument("--out", type=Path, default=Path("reports"), help="default: reports/")
    add_doctor_parser(sub)
    return parser


def add_doctor_parser(sub: argparse._SubParsersAction) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="diagnose your own attention module",
        description="Run black-box probes on a self-attention module: exit 0 healthy "
        "(warnings allowed), 1 a probe failed, 2 usage error.",
    )
    doctor.add_argument("target", help="path/to/file.py:name or package.module:name")
    doctor.add_argument(
        "--mask",
        choices=MASKS,
        default="none",
        help="the module's mask convention: keep (1/True attends), drop (True is blocked, as "
        "nn.MultiheadAttention), additive (float added to the scores), none (takes no mask)",
    )
    doctor.add_argument("--causal", action="store_true", help="it masks the future by itself")
    doctor.add_argument(
        "--mask-shape",
        choices=MASK_SHAPES,
        default="bqk",
        help="bqk: (B, T, T); b1qk: (B, 1, T, T); bk: key padding (B, T)",
    )
    doctor.add_argument("--mask-dtype", choices=["bool", "float"], default="bool",
                        help="keep/drop masks as bool (default) or as float 0/1")  # fmt: skip
    doctor.add_argument(
        "--mask-arg",
        metavar="NAME",
        help="the forward parameter that gets the mask, when it has several (attn_mask, "
        "key_padding_mask, ...); default: the one that works",
    )
    doctor.add_argument("--sequence-first", action="store_true",
                        help="it takes (T, B, d) tensors, as fairseq and torch's batch_first=False "
                        "(read off a module's batch_first attribute when it has one)")  # fmt: skip
    doctor.add_argument("--positional", action="store_true",
                        help="it uses positions: skip the permutation probe")  # fmt: skip
    doctor.add_argument("--d-model", type=int, default=64, help="passed to the factory (64)")
    doctor.add_argument("--heads", type=int, default=4, help="passed to the factory (4)")
    doctor.add_argument(
        "--init",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a constructor or config value the doctor cannot guess (a Python literal, else a "
        "string); repeatable",
    )
    doctor.add_argument("--seed", type=int, default=0, help="seed for weights and inputs (0)")
    doctor.add_argument("--batch", type=int, default=4)
    doctor.add_argument("--seq-len", type=int, default=8)
    doctor.add_argument("--device", default="cpu")
    doctor.add_argument("--strict", action="store_true", help="warnings fail too")
    doctor.add_argument("--json", action="store_true", help="print JSON instead of text")
    doctor.add_argument("--report", type=Path, help="also write a markdown report here")
    doctor.add_argument(
        "--timeout",
        type=float,
        default=TIMEOUT,
        metavar="SECONDS",
        help=f"time limit of each probe, and of building the module ({TIMEOUT:g}; 0: none)",
    )


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


def resolve_grid(args: argparse.Namespace) -> list[tuple[torch.device, torch.dtype]]:
    """Every (device, dtype) asked for, validated up front."""
    devices = [resolve_device(d) for d in dict.fromkeys(args.device or available_devices())]
    dtypes = list(dict.fromkeys(args.dtype or DTYPES))
    return [(dev, resolve_dtype(name, dev)) for dev in devices for name in dtypes]


def resolve_pairs(ids: Sequence[str]) -> list[Pair]:
    try:
        return [registry.load(i) for i in ids] if ids else registry.load_all()
    except registry.UnknownPitfall as exc:
        raise UsageError(str(exc)) from None


def measure_grid(
    pairs: list[Pair], grid: list[tuple[torch.device, torch.dtype]]
) -> list[Measurement]:
    """Measure every pair on every (device, dtype), with a progress bar on a terminal."""
    jobs = [(p, dev, dt) for p in pairs for dev, dt in grid]
    results = []
    with Progress(len(jobs)) as bar:
        for pair, dev, dt in jobs:
            bar.step(f"{pair.card.id} {dev} {dtype_name(dt)}")
            results.append(measure(pair, dev, dt))
    return results


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


def cmd_list(args: argparse.Namespace) -> str:
    pairs = registry.load_all()
    width = max(len(p.card.id) for p in pairs)
    return "\n".join(
        f"{p.card.id:<{width}}  {p.card.section:<5}  {p.card.category:<14}  {p.card.expected}"
        for p in pairs
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
    colour = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    return colour_diff(diff) if colour else diff


def cmd_run(args: argparse.Namespace) -> str:
    pairs = resolve_pairs(args.ids)
    grid = resolve_grid(args)
    table = summary_table(measure_grid(pairs, grid))
    if args.format == "csv":
        return table.to_csv(index=False).rstrip("\n")
    if args.format == "json":  # JSON has no Inf: keep it apart from null (not measured)
        finite = table.astype(object).replace({math.inf: "inf", -math.inf: "-inf"})
        return finite.to_json(orient="records", indent=2, double_precision=15)
    return table.to_markdown(index=False, floatfmt=".3g")


def cmd_doctor(args: argparse.Namespace) -> tuple[str, int]:
    device = resolve_device(args.device)
    sizes = Sizes(args.d_model, args.heads, init=parse_init(args.init))
    if args.report is not None:
        ensure_writable(args.report.parent if str(args.report.parent) else Path("."))
    if not args.timeout >= 0:  # NaN too
        raise UsageError("--timeout must be a number of seconds >= 0 (0: no limit)")
    config = Config(
        mask=args.mask, causal=args.causal, mask_shape=args.mask_shape,
        mask_dtype=args.mask_dtype, positional=args.positional, strict=args.strict,
        sequence_first=args.sequence_first, mask_arg=args.mask_arg,
        batch=args.batch, seq_len=args.seq_len, d_model=args.d_model, device=str(device),
        seed=args.seed,
    )  # fmt: skip
    try:  # importing and building run the user's code too
        with guarded(args.timeout):
            module = build_target(load_object(args.target), sizes, args.seed)
    except UserCodeError as exc:
        raise UsageError(f"building {args.target} stopped: it {exc}") from None
    with Progress(len(STEPS)) as bar:  # on stderr, on a terminal, after the first second
        diagnosis = diagnose(module, config, args.target, args.timeout, progress=bar.step)
    if args.report is not None:
        write_atomically(args.report, diagnosis.markdown())
    return (diagnosis.to_json() if args.json else diagnosis.text()), diagnosis.exit_code


def cmd_report(args: argparse.Namespace) -> str:
    grid = resolve_grid(args)
    ensure_writable(args.out)
    unavailable = [d for d in DEVICE_KINDS if d not in available_devices()]
    results, timed = collect(registry.load_all(), grid, measure_grid)
    doctor = detection_markdown(detection_table()) + "\n\n" + real_markdown(real_table())
    path = write_report(results, grid, args.out, unavailable, timed, doctor)
    return f"wrote {path}"


COMMANDS = {
    "list": cmd_list,
    "show": cmd_show,
    "diff": cmd_diff,
    "run": cmd_run,
    "report": cmd_report,
    "doctor": cmd_doctor,
}


def main(argv: Sequence[str] | None = None) -> int:
    torch.set_num_threads(1)  # tiny tensors: faster, and the numbers never depend on core count
    try:
        args = build_parser().parse_args(argv)
        result = COMMANDS[args.command](args)
        text, code = result if isinstance(result, tuple) else (result, 0)
        print(text)
        return code
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. piped into head: not an error of ours
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's final flush quiet
        return 0
