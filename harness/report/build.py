"""The report command's work: measure the catalogue on the grid, each trap's extras and its
learning probe, the doctor's tables on the other core, then write the folder (``write``).

The command line resolves the grid and calls ``build_report``; nothing here parses arguments.
What a run measured is kept in the store (``harness.report.store``) by the content of what made
it: a trap's pair files and the harness's code, the grid, the libraries; a run with the same
inputs reuses it and says so, and a changed pair file recomputes that trap alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from harness import interrupts
from harness.catalogue import registry
from harness.catalogue.card import Pair
from harness.catalogue.judge import measure_grid
from harness.catalogue.learn import learn as learn_pair
from harness.catalogue.spread import Spread, output_spread
from harness.devices import DEVICE_KINDS, available_devices
from harness.files import TIMINGS, created_by, ensure_writable
from harness.forked import forked
from harness.learning import Learning
from harness.progress import Progress
from harness.report import store
from harness.report.doctor_tables import doctor_sections
from harness.report.extras import generation_steps
from harness.report.results import Grid, TrapResult
from harness.report.store import Store
from harness.report.write import write_report
from harness.zoo.table import COMMITTED as COMMITTED_ZOO
from harness.zoo.table import ZOO_FILE


@dataclass
class Kept:
    """What the store keeps of one trap: its measurement, extras and learning, and its timing
    table (wall-clock: kept with the rest, so a reused timing is the run's that measured it)."""

    cells: list = field(default_factory=list)
    extras: list[pd.DataFrame] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    learning: Learning | None = None
    timing: pd.DataFrame | None = None
    spread: Spread | None = None


def trap_key(pair: Pair, grid: Grid, learn: bool) -> str:
    """The store's key of one trap: its folder's files and the catalogue's shared ones, the
    grid and whether it learns, in this environment (``store.key``)."""
    folder = Path(pair.buggy.__file__).resolve().parent
    shared = list(folder.parent.glob("*.py"))  # pitfalls/__init__.py, test_pairs.py
    cells = [(str(device), str(dtype)) for device, dtype in grid]
    files = store.source_files(folder, "*") + shared
    return store.key("trap", cells, learn, files=files, root=folder.parent)


def doctor_key(out: Path) -> str:
    """The doctor tables' key: every pair's files (the detection table), and the zoo table the
    section quotes."""
    folder = Path(registry.HOME)
    zoo = [p.resolve() for p in (out / ZOO_FILE, COMMITTED_ZOO) if p.is_file()][:1]
    return store.key("doctor", files=store.source_files(folder, "*") + zoo, root=Path("/"))


def collect(
    pairs: list[Pair],
    grid: Grid,
    progress: Callable[[str], None] = lambda label: None,
    learn: Callable[[Pair, torch.device], Learning] | None = None,
    kept: Store | None = None,
) -> tuple[list[TrapResult], dict[str, pd.DataFrame]]:
    """Measure everything, then each trap's extra on the first device in float32, and (with
    ``learn``) its learning probe on that device; a trap the store ``kept`` holds for these
    inputs is taken from it."""
    kept = kept or Store(None)
    keys = {p.card.id: trap_key(p, grid, learn is not None) for p in pairs}
    found = {p.card.id: kept.get(keys[p.card.id]) for p in pairs}
    found = {pid: k for pid, k in found.items() if isinstance(k, Kept)}
    missing = [p for p in pairs if p.card.id not in found]
    cells = measure_grid(missing, grid, progress) if missing else []
    device = grid[0][0]
    results, timed = [], {}
    for pair in pairs:
        pid = pair.card.id
        if pid in found:
            k = found[pid]
            for _ in range(len(grid) + 1 + (learn is not None)):
                progress(f"{pid}: kept")
            results.append(
                TrapResult(
                    pair, k.cells, k.extras, k.notes, k.learning, spread=k.spread, key=keys[pid]
                )
            )
            if k.timing is not None:
                timed[pid] = k.timing
            continue
        progress(f"{pid}: its own measurement")
        r = TrapResult(pair, [m for m in cells if m.pitfall == pid], key=keys[pid])
        r.spread = output_spread(pair, r.primary)
        if pair.card.how.cached and r.primary.outputs.get("ref") is not None:
            r.extras.append(generation_steps(r.primary, pair.card))
        if pair.card.extra is not None:
            extra = pair.card.extra(pair, device, torch.float32)
            if extra.attrs.get("timing"):
                timed[pid] = extra
                r.notes.append(
                    f"Wall-clock timing, with a plot of the time ratio: `{TIMINGS}` beside the "
                    "report (uncommitted).\n"
                )
            else:
                r.extras.append(extra)
        if learn is not None:
            progress(f"{pid}: training")
            r.learning = learn(pair, device)
        kept.put(keys[pid], Kept(r.cells, r.extras, r.notes, r.learning, timed.get(pid), r.spread))
        results.append(r)
    return results, timed


def build_report(grid: Grid, out: Path, learn: bool = True, kept: Store | None = None) -> str:
    """Measure every trap on ``grid`` (with the learning probe unless ``learn`` is False) and
    write the report into ``out``, reusing what the store ``kept`` holds for these inputs; what
    happened, in one line."""
    created = ensure_writable(out)
    kept = kept or Store(None)
    unavailable = [d for d in DEVICE_KINDS if d not in available_devices()]
    pairs = registry.load_all()
    learns = len(pairs) if learn else 0
    steps = len(pairs) * len(grid) + 2 * len(pairs) + learns + 3  # + doctor x2, writing
    with created_by(created), Progress(steps) as bar:

        def step(label: str) -> None:
            interrupts.ACTIVE.check()  # a Ctrl-C matplotlib's clean-up swallowed stops here
            bar.step(label)

        train = (lambda pair, device: learn_pair(pair, device=device)) if learn else None
        tables_key = doctor_key(out)
        doctor = kept.get(tables_key)
        # the doctor's tables on the second core, forked once the imports are done: each of
        # their diagnoses is seeded, so the bytes are those of one process
        with (
            forked(doctor_sections, out)
            if not isinstance(doctor, dict)
            else _given(doctor) as tables
        ):
            results, timed = collect(pairs, grid, progress=step, learn=train, kept=kept)
            step("the doctor on the catalogue")
            doctor = tables()
        kept.put(tables_key, doctor)
        step("the doctor on real modules")
        path, replaced = write_report(results, grid, out, unavailable, timed, doctor, progress=step,
                                      kept=kept)  # fmt: skip
    kept.prune()
    reused = f" ({kept.hits} of {kept.hits + kept.misses} results reused from {kept.folder})" \
        if kept.hits else ""  # fmt: skip
    if not replaced:
        return (f"{path} is up to date: this run agrees with it within rounding noise (kept as "
                f"is){reused}")  # fmt: skip
    return f"wrote {path}{reused}"


@contextlib.contextmanager
def _given(value: str) -> Iterator[Callable[[], str]]:
    """``forked``'s shape for a value already at hand."""
    yield lambda: value
