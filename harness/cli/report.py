"""The report command: ``python -m harness report``.

A run whose inputs did not change since the last one, into a folder that the last one left as it
is, is answered from the store's receipt (``harness.report.receipt``) before torch is imported;
any other run measures what the store does not hold and writes the report
(``harness.report.build``), then keeps its receipt.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.errors import UsageError, printable, shorten
from harness.files import REPORT
from harness.report import receipt
from harness.report.store import Store, default_folder


def store(args: argparse.Namespace) -> Store:
    """The store the run reuses and keeps its results in; none with ``--no-store``."""
    return Store(None if args.no_store else default_folder())


def run_key(args: argparse.Namespace) -> str:
    """The receipt's key for this command line (``receipt.run_key``) with the devices torch
    offers here, asked of torch only where only torch knows."""
    available = receipt.devices_without_torch()
    if available is None:
        from harness.devices import available_devices  # torch

        available = available_devices()
    return receipt.run_key(args.device, args.dtype, not args.no_learn, args.out, available)


def unchanged(args: argparse.Namespace) -> str | None:
    """The line that says the report in ``--out`` is current, when the store's receipt shows
    that nothing it is made from changed and its folder is as the last run left it; else None."""
    kept = store(args)
    if kept.folder is None or not receipt.unchanged(kept, run_key(args), args.out):
        return None
    return (
        f"{args.out / REPORT} is up to date: nothing it is made from changed since the last "
        f"run, and its folder is as that run left it (receipt in {kept.folder}; --no-store "
        "measures everything again)"
    )


def cmd_report(args: argparse.Namespace) -> str:
    """Measure what the store does not hold, write the report, and keep the run's receipt."""
    from harness.cli.catalogue import resolve_grid  # torch, pandas and the catalogue
    from harness.report.build import build_report
    from harness.report.workers import available_cores

    kept = store(args)
    key = run_key(args)
    workers = args.workers or available_cores()

    def keep_receipt() -> None:  # holding the folder's lock: no other run's report comes between
        if run_key(args) == key:  # no input changed while it ran
            receipt.keep(kept, key, args.out)

    return build_report(resolve_grid(args), args.out, not args.no_learn, kept, workers,
                        published=keep_receipt)  # fmt: skip


def report_text(folder: Path) -> str:
    """The report in ``folder`` (or the folder of a ``report.md`` given), its pages joined in
    reading order; a usage error where there is none."""
    from harness.report.pages import joined, read_pages

    folder = folder.parent if folder.name == REPORT else folder
    if (folder / REPORT).exists() and not (folder / REPORT).is_file():
        raise UsageError(f"no report in {shorten(folder)}: its {REPORT} is not a file")
    if not (folder / REPORT).is_file():
        raise UsageError(f"no report in {shorten(folder)}: {REPORT} is missing")
    try:
        return joined(read_pages(folder))
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the report in {shorten(folder)}: {exc}") from None


def cmd_compare(args: argparse.Namespace) -> tuple[str, int]:
    """Two reports, by the rule the committed report is held to (``harness.report.diff``):
    exit 0 when they agree, 1 with one line per disagreement when they do not."""
    from harness.report.diff import compare

    old, new = report_text(args.old), report_text(args.new)
    problems = compare(old, new, optional=False)
    if not problems:
        return f"{args.old} and {args.new} agree: within rounding, and tallies within chance", 0
    return printable("\n".join([f"{args.old} and {args.new} disagree:", *problems])), 1
