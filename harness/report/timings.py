"""timings.md, beside report.md: the wall-clock measurements, which vary from run to run and so
stay out of the report, with the plots their tables ask for (``timings-<trap>-<n>.png`` beside
it, as uncommitted as it is)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pandas as pd

from harness.files import REPORT
from harness.report import store
from harness.report.format import table
from harness.report.store import Store


def picture_names(timed: dict[str, pd.DataFrame]) -> dict[str, list[str]]:
    """The file names of each timing table's plots, beside timings.md."""
    return {
        pid: [f"timings-{pid}-{i}.png" for i in range(1, len(df.attrs.get("plots", [])) + 1)]
        for pid, df in timed.items()
    }


def draw_timings(
    timed: dict[str, pd.DataFrame], folder: Path, kept: Store | None = None
) -> list[str]:
    """Draw the plots the timing tables ask for into ``folder``, or write the ones the store
    ``kept`` holds for the same table (a trap it kept); their names."""
    names = picture_names(timed)
    kept = kept or Store(None)
    for pid, df in timed.items():
        if not names[pid]:
            continue
        # in full: a repr of a long table or array is cut short
        key = store.key("timing pictures", pid, df.to_csv(), pickle.dumps(df.attrs["plots"]))
        found = kept.get(key)
        if isinstance(found, dict) and set(found) == set(names[pid]):
            for name, data in found.items():
                (folder / name).write_bytes(data)
            continue
        from harness.report.pictures import plot  # matplotlib, only when there is a plot

        for name, spec in zip(names[pid], df.attrs["plots"], strict=True):
            plot(folder / name, df, spec)
        kept.put(key, {name: (folder / name).read_bytes() for name in names[pid]})
    return [name for pictures in names.values() for name in pictures]


def timings_text(timed: dict[str, pd.DataFrame]) -> str:
    lines = [
        "# Wall-clock measurements",
        "",
        f"Not deterministic: they vary from run to run and machine to machine, so they live apart "
        f"from [{REPORT}]({REPORT}).",
    ]
    names = picture_names(timed)
    for pid, df in timed.items():
        lines += ["", f"## `{pid}`", "", table(df)]
        lines += [line for name in names[pid] for line in ("", f"![{pid}: timing]({name})")]
    return "\n".join(lines) + "\n"
