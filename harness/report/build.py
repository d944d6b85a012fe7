"""The report command's work: measure the catalogue on the grid, each trap's extras and its
learning probe, the doctor's tables on the other core, then write the folder (``write``).

The command line resolves the grid and calls ``build_report``; nothing here parses arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch

from harness import interrupts
from harness.catalogue import registry
from harness.catalogue.card import Pair
from harness.catalogue.judge import measure_grid
from harness.catalogue.learn import learn as learn_pair
from harness.devices import DEVICE_KINDS, available_devices
from harness.files import TIMINGS, created_by, ensure_writable
from harness.forked import forked
from harness.learning import Learning
from harness.progress import Progress
from harness.report.doctor_tables import doctor_sections
from harness.report.extras import generation_steps
from harness.report.results import Grid, TrapResult
from harness.report.write import write_report


def collect(
    pairs: list[Pair],
    grid: Grid,
    progress: Callable[[str], None] = lambda label: None,
    learn: Callable[[Pair, torch.device], Learning] | None = None,
) -> tuple[list[TrapResult], dict[str, pd.DataFrame]]:
    """Measure everything, then each trap's extra on the first device in float32, and (with
    ``learn``) its learning probe on that device."""
    cells = measure_grid(pairs, grid, progress)
    device = grid[0][0]
    results, timed = [], {}
    for pair in pairs:
        progress(f"{pair.card.id}: its own measurement")
        r = TrapResult(pair, [m for m in cells if m.pitfall == pair.card.id])
        if pair.card.how.cached and r.primary.outputs.get("ref") is not None:
            r.extras.append(generation_steps(r.primary, pair.card))
        if pair.card.extra is not None:
            extra = pair.card.extra(pair, device, torch.float32)
            if extra.attrs.get("timing"):
                timed[pair.card.id] = extra
                r.notes.append(f"Wall-clock timing: `{TIMINGS}` beside the report (uncommitted).\n")
            else:
                r.extras.append(extra)
        if learn is not None:
            progress(f"{pair.card.id}: training")
            r.learning = learn(pair, device)
        results.append(r)
    return results, timed


def build_report(grid: Grid, out: Path, learn: bool = True) -> str:
    """Measure every trap on ``grid`` (with the learning probe unless ``learn`` is False) and
    write the report into ``out``; what happened, in one line."""
    created = ensure_writable(out)
    unavailable = [d for d in DEVICE_KINDS if d not in available_devices()]
    pairs = registry.load_all()
    learns = len(pairs) if learn else 0
    steps = len(pairs) * len(grid) + 2 * len(pairs) + learns + 3  # + doctor x2, writing
    with created_by(created), Progress(steps) as bar:

        def step(label: str) -> None:
            interrupts.ACTIVE.check()  # a Ctrl-C matplotlib's clean-up swallowed stops here
            bar.step(label)

        train = (lambda pair, device: learn_pair(pair, device=device)) if learn else None
        # the doctor's tables on the second core, forked once the imports are done: each of
        # their diagnoses is seeded, so the bytes are those of one process
        with forked(doctor_sections, out) as tables:
            results, timed = collect(pairs, grid, progress=step, learn=train)
            step("the doctor on the catalogue")
            doctor = tables()
        step("the doctor on real modules")
        path, replaced = write_report(results, grid, out, unavailable, timed, doctor, progress=step)
    if not replaced:
        return f"{path} is up to date: this run agrees with it within rounding noise (kept as is)"
    return f"wrote {path}"
