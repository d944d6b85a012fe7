"""The report command's work: measure the catalogue on the grid, each trap's extras and its
learning probe, and the doctor's tables, spread over the cores (``harness.report.workers``),
then write the folder (``write``).

The command line resolves the grid and calls ``build_report``; nothing here parses arguments.
What a run measured is kept in the store (``harness.report.store``) by the content of what made
it: a trap's pair files and the harness's code, the grid, the libraries; a run with the same
inputs reuses it and says so, and a changed pair file recomputes that trap alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from harness import interrupts
from harness.catalogue import registry
from harness.catalogue.card import Pair
from harness.catalogue.judge import measure
from harness.catalogue.learn import fixed_key, learn_all
from harness.catalogue.spread import Spread, output_spread
from harness.devices import DEVICE_KINDS, available_devices, dtype_name
from harness.files import TIMINGS, created_by, ensure_writable
from harness.learning import STEPS, Learning
from harness.progress import Progress
from harness.report import store
from harness.report.doctor_tables import TABLES, assembled, on_libraries
from harness.report.extras import generation_steps
from harness.report.results import Grid, TrapResult
from harness.report.store import Store
from harness.report.workers import Pending, Submit, here, pool
from harness.report.write import drawn_bytes, write_report
from harness.tutorial.own_code import TUTORIAL, diagnoses
from harness.validation import DetectionRow, detection_rows, reference_rows


@dataclass
class Kept:
    """What the store keeps of one trap: its measurement, extras and learning, its rows of the
    doctor's detection table, and its timing table (wall-clock: kept with the rest, so a reused
    timing is the run's that measured it)."""

    cells: list = field(default_factory=list)
    extras: list[pd.DataFrame] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    learning: Learning | None = None
    timing: pd.DataFrame | None = None
    spread: Spread | None = None
    detection: list[DetectionRow] = field(default_factory=list)

    def result(
        self, pair: Pair, key: str = "", pictures: dict[str, bytes] | None = None
    ) -> TrapResult:
        """What the report shows for ``pair``, from what was kept (under ``key``)."""
        return TrapResult(pair, self.cells, self.extras, self.notes, self.learning,
                          spread=self.spread, key=key, pictures=pictures,
                          detection=self.detection)  # fmt: skip


def trap_key(pair: Pair, grid: Grid, learn: bool) -> str:
    """The store's key of one trap: its folder's files and the catalogue's shared ones, the
    grid and whether it learns, in this environment (``store.key``)."""
    folder = Path(pair.buggy.__file__).resolve().parent
    shared = list(folder.parent.glob("*.py"))  # pitfalls/__init__.py, test_pairs.py
    cells = [(str(device), str(dtype)) for device, dtype in grid]
    files = store.source_files(folder, "*") + shared
    return store.key("trap", cells, learn, files=files, root=folder.parent)


def doctor_keys() -> dict[str, str]:
    """The keys of the doctor's pieces besides the traps' own rows: on the tutorial's modules
    (its file), on the reference modules and on real libraries (the harness and the libraries
    alone: a changed pair file leaves them kept)."""
    tutorial = Path(TUTORIAL)
    return {
        "tutorial": store.key("doctor on the tutorial", files=[tutorial], root=tutorial.parent),
        "references": store.key("doctor on reference modules"),
        "libraries": store.key("doctor on libraries"),
    }


# The doctor's pieces by name (keyed by doctor_keys): what makes each, what it is, and its line
# in the progress.
DOCTOR_PIECES = {
    "libraries": (on_libraries, str, "the doctor on real modules"),  # the longest first
    "references": (reference_rows, list, "the doctor on reference modules"),
    "tutorial": (diagnoses, pd.DataFrame, "the doctor on the tutorial's modules"),
}


def doctor_pieces(
    kept: Store, submit: Submit, keys: dict[str, str]
) -> tuple[dict[str, object], dict[str, Pending]]:
    """The doctor's pieces: those the store holds (under ``keys``), and the others
    ``submit``-ted (made by a worker); each of its diagnoses is seeded, so where it runs does
    not matter."""
    found, pending = {}, {}
    for name, (make, kind, _) in DOCTOR_PIECES.items():
        piece = kept.get(keys[name])
        if isinstance(piece, kind):
            found[name] = piece
        else:
            pending[name] = submit(make)
    return found, pending


def pages_key(
    results: list[TrapResult],
    tables_key: str,
    grid: Grid,
    unavailable: list[str],
    timed: dict[str, pd.DataFrame],
) -> str:
    """The key of the report's pages: every trap's key (its pictures' names follow from it),
    the doctor tables', and what else they are rendered from; "" when a result has no key."""
    if not all(r.key for r in results):
        return ""
    traps = [r.key for r in results]
    return store.key("pages", traps, tables_key, grid, unavailable, sorted(timed))


def measure_trap(pair: Pair, grid: Grid) -> Kept:
    """One trap's measurement: its cells on ``grid``, its output error over seeds, its extras
    on the first device in float32, and the doctor on its two modules (its rows of the
    detection table); its learning probe is a piece of its own (``learned``)."""
    kept = Kept([measure(pair, device, dtype) for device, dtype in grid])
    primary = kept.result(pair).primary
    kept.spread = output_spread(pair, primary)
    if pair.card.how.cached and primary.outputs.get("ref") is not None:
        kept.extras.append(generation_steps(primary, pair.card))
    if pair.card.extra is not None:
        extra = pair.card.extra(pair, grid[0][0], torch.float32)
        if extra.attrs.get("timing"):
            kept.timing = extra
            kept.notes.append(
                f"Wall-clock timing, with a plot of the time ratio: `{TIMINGS}` beside the "
                "report (uncommitted).\n"
            )
        else:
            kept.extras.append(extra)
    kept.detection = detection_rows(pair)
    return kept


# What a worker is sent for a trap of the catalogue, named by id: its measurement and its
# learning probe, two pieces (so that one trap keeps two cores busy), each with its pictures.
Pictures = dict[str, bytes]  # drawn, by name


def measured(pitfall_id: str, grid: Grid) -> tuple[Kept, Pictures]:
    """``measure_trap`` of the trap ``pitfall_id``, and the pictures drawn from it."""
    pair = registry.load(pitfall_id)
    kept = measure_trap(pair, grid)
    return kept, drawn_bytes(kept.result(pair))  # no learning yet: its own piece draws it


def learned(pitfall_ids: tuple[str, ...], device: torch.device) -> list[tuple[Learning, Pictures]]:
    """The learning probe of the traps ``pitfall_ids`` on ``device`` (fixed.py trained once
    where theirs trains alike: ``learn_all``), each with its picture."""
    pairs = [registry.load(pid) for pid in pitfall_ids]
    learnings = learn_all(pairs, device=device)
    return [
        (learning, drawn_bytes(Kept(learning=learning).result(pair)))  # no cells: curves only
        for pair, learning in zip(pairs, learnings, strict=True)
    ]


def by_fixed_side(pairs: list[Pair], device: torch.device) -> list[tuple[str, ...]]:
    """The ids of ``pairs`` grouped by how their fixed.py trains (``fixed_key``), in order of
    each group's first pair: a group's fixed.py is trained once."""
    groups: dict[str, list[str]] = {}
    for pair in pairs:
        groups.setdefault(fixed_key(pair, 0, STEPS, device), []).append(pair.card.id)
    return [tuple(ids) for ids in groups.values()]


def collect(
    pairs: list[Pair],
    grid: Grid,
    progress: Callable[[str], None] = lambda label: None,
    learn: bool = False,
    kept: Store | None = None,
    submit: Submit = here,
) -> tuple[list[TrapResult], dict[str, pd.DataFrame]]:
    """Every trap's measurement, learning probe (with ``learn``) and pictures, each
    ``submit``-ted to the report's workers (by id: pairs of the catalogue), by default made
    here in turn; a trap the store ``kept`` holds for these inputs is taken from it."""
    kept = kept or Store(None)
    keys = {p.card.id: trap_key(p, grid, learn) for p in pairs}
    found = {p.card.id: kept.get(keys[p.card.id]) for p in pairs}
    made = [p.card.id for p in pairs if not isinstance(found[p.card.id], Kept)]
    device = grid[0][0]
    pending = {pid: submit(measured, pid, grid) for pid in made}
    training: dict[str, tuple[Pending, int]] = {}  # a trap's group's piece, and its place there
    groups = by_fixed_side([p for p in pairs if p.card.id in made], device) if learn else []
    for group in groups:
        piece = submit(learned, group, device)
        training |= {pid: (piece, i) for i, pid in enumerate(group)}
    results, timed = [], {}
    for pair in pairs:
        pid = pair.card.id
        steps = [f"{pid} {where} {dtype_name(dtype)}" for where, dtype in grid]
        steps += [f"{pid}: its own measurement"] + ([f"{pid}: training"] if learn else [])
        pictures = None
        if pid in pending:
            k, pictures = pending[pid].get()
            if pid in training:
                piece, at = training[pid]
                k.learning, learning_pictures = piece.get()[at]
                pictures |= learning_pictures
            kept.put(keys[pid], k)
        else:
            k, steps = found[pid], [f"{pid}: kept"] * len(steps)
        for label in steps:
            progress(label)
        results.append(k.result(pair, keys[pid], pictures))
        if k.timing is not None:
            timed[pid] = k.timing
    return results, timed


def build_report(
    grid: Grid,
    out: Path,
    learn: bool = True,
    kept: Store | None = None,
    workers: int = 1,
    published: Callable[[], None] = lambda: None,
) -> str:
    """Measure every trap on ``grid`` (with the learning probe unless ``learn`` is False) and
    write the report into ``out``, reusing what the store ``kept`` holds for these inputs, with
    the independent pieces (each trap, the doctor's tables) spread over ``workers`` processes;
    what happened, in one line. ``published`` runs as ``write_report`` says: the folder
    whole, its lock still held."""
    created = ensure_writable(out)
    kept = kept or Store(None)
    unavailable = [d for d in DEVICE_KINDS if d not in available_devices()]
    pairs = registry.load_all()
    learns = len(pairs) if learn else 0
    steps = len(pairs) * len(grid) + 2 * len(pairs) + learns + len(DOCTOR_PIECES) + 1  # writing
    with created_by(created), Progress(steps) as bar, pool(workers) as submit:

        def step(label: str) -> None:
            interrupts.ACTIVE.check()  # a Ctrl-C matplotlib's clean-up swallowed stops here
            bar.step(label)

        # the doctor's pieces first: the longest ones
        keys = doctor_keys()
        pieces, pending = doctor_pieces(kept, submit, keys)
        results, timed = collect(pairs, grid, progress=step, learn=learn, kept=kept,
                                 submit=submit)  # fmt: skip
        for name, (_, _, label) in DOCTOR_PIECES.items():
            if name in pending:
                pieces[name] = pending[name].get()
                kept.put(keys[name], pieces[name])
            step(label)
        doctor = assembled([row for r in results for row in r.detection], pieces, out)
        tables_key = store.key("doctor", keys, doctor[TABLES])  # the zoo's summary included
        pages = pages_key(results, tables_key, grid, unavailable, timed)
        path, replaced = write_report(results, grid, out, unavailable, timed, doctor, progress=step,
                                      kept=kept, pages_key=pages, published=published)  # fmt: skip
    kept.prune()
    reused = f" ({kept.hits} of {kept.hits + kept.misses} results reused from {kept.folder})" \
        if kept.hits else ""  # fmt: skip
    if not replaced:
        return (f"{path} is up to date: this run agrees with it within rounding noise (kept as "
                f"is){reused}")  # fmt: skip
    return f"wrote {path}{reused}"
