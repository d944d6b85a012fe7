"""Drawing a trap's pictures: its heatmap (chosen by ``harness.report.choice``), its learning
curves, and the plots its extra tables ask for.

The heatmap's title says which cell, row and head are drawn, and on what inputs.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from harness.catalogue.card import Card
from harness.catalogue.judge import EDGE_NAMES, Measurement
from harness.files import IMAGES
from harness.learning import GENERATION, Learning, Run
from harness.plots import Panel, bar_plot, heatmaps, legend, line_plot, lines_beside_heatmaps
from harness.report.choice import (
    BITES,
    OUTPUT,
    SAME,
    WEIGHTS,
    Choice,
    as_array,
    choose,
    curves_differ,
    heatmap_absent,
    same,
)
from harness.report.results import TrapResult

TITLE_WIDTH = 100  # characters per title line after the first


def where(index: tuple[int, ...], shape: tuple[int, ...], kind: str) -> str:
    """``batch row b (of 0-B-1), head h (of 0-H-1)``: the map at ``index`` of ``shape``."""
    words = [f"batch row {index[0]} (of 0-{shape[0] - 1})"] if index else []
    if kind == WEIGHTS and len(index) > 1:
        words.append(f"head {index[1]} (of 0-{shape[1] - 1})")
    return ", ".join(words)


def context(choice: Choice, card: Card, primary: Measurement) -> list[str]:
    """What the picture is drawn on, beyond the cell: inputs, shape, seeds, agreement."""
    m, words = choice.cell, []
    if m is not primary and primary.verdict not in BITES:
        words.append(f"{primary.verdict} in {primary.dtype}")
    if m.trigger is not None:
        words.append(f"trigger shape {m.shape.label()}")
    if m.edge:
        words.append(f"edge inputs: {EDGE_NAMES[card.edge]}")
    if m.seeds:
        words.append(f"modules from seed {m.seed} of the {m.seeds} compared")
    if choice.kind == OUTPUT:
        fix, bug = m.weights.get("fix"), m.weights.get("bug")
        if fix is None and bug is None:
            words.append("neither module returns its attention weights")
        elif same(as_array(fix), as_array(bug)):
            words.append("attention weights identical: the output is assembled wrong")
    if choice.same:
        words.append(f"buggy.py and fixed.py agree to {SAME:g} here")
    return words


def title(choice: Choice, card: Card, primary: Measurement, panels: list[Panel]) -> str:
    """Trap, what is drawn, cell, row and head; then inputs, agreement and the marks' legend."""
    m = choice.cell
    source = m.weights if choice.kind == WEIGHTS else m.outputs
    shape = next(tuple(t.shape) for t in (source.get("fix"), source.get("bug")) if t is not None)
    head = f"{card.id}: {choice.kind}, {m.cell} ({m.verdict})"
    place = where(choice.index, shape, choice.kind)
    first = f"{head}, {place}" if place else head
    rest = "; ".join([*context(choice, card, primary), *legend(panels)])
    return "\n".join([first, *textwrap.wrap(rest, TITLE_WIDTH)])


def weight_panels(choice: Choice) -> list[Panel]:
    """fixed.py's and buggy.py's attention weights, one scale, blocked cells hatched."""
    m = choice.cell
    fix, bug = as_array(m.weights.get("fix")), as_array(m.weights.get("bug"))
    blocked = None if m.keep is None else ~m.keep[choice.index[0] if choice.index else 0].numpy()
    maps = [None if a is None else a[choice.index] for a in (fix, bug)]
    top = max([1.0, *(float(np.nanmax(a, initial=0.0)) for a in maps if a is not None)])
    top = min(top, 2.0)  # a weight above 1 is already the finding; keep 0..1 readable
    note = f"raises:\n{m.error}" if m.raised else "returns no attention weights"
    return [
        Panel("fixed.py", maps[0], "returns no attention weights", vmax=top, blocked=blocked),
        Panel("buggy.py", maps[1], note, vmax=top, blocked=blocked),
    ]


def output_panels(choice: Choice) -> list[Panel]:
    """fixed.py's and buggy.py's outputs on one symmetric scale, then |buggy - fixed|."""
    m = choice.cell
    fix, bug = (as_array(m.outputs.get(k)) for k in ("fix", "bug"))
    maps = [None if a is None else a[choice.index] for a in (fix, bug)]
    finite = [np.abs(a[np.isfinite(a)]) for a in maps if a is not None]
    top = max([SAME, *(float(a.max(initial=0.0)) for a in finite)])
    axes = dict(xlabel="feature", ylabel="position")
    values = dict(label="output value", vmin=-top, vmax=top, cmap="PRGn", **axes)
    note = f"raises:\n{m.error}" if m.raised else "returns no output"
    panels = [
        Panel("fixed.py", maps[0], note, **values),
        Panel("buggy.py", maps[1], note, **values),
    ]
    if maps[0] is None or maps[1] is None or maps[0].shape != maps[1].shape:
        shapes = " and ".join(str(None if a is None else a.shape) for a in maps)
        return [*panels, Panel("|buggy - fixed|", None, f"nothing to subtract: {shapes}")]
    error = np.abs(maps[1] - maps[0])
    spread = max(SAME, float(np.nanmax(np.where(np.isfinite(error), error, 0.0))))
    label = "|buggy - fixed| output"
    return [*panels, Panel("|buggy - fixed|", error, label=label, vmax=spread, **axes)]


def draw(r: TrapResult, folder: Path) -> list[str]:
    """Write a trap's pictures under ``folder/img``; their paths relative to ``folder``. Those
    of its measurement, then those of its learning probe: of what ``r`` has (a result with no
    cells, or no learning, is a part that a worker draws apart).

    ``img/<id>.png``: the heatmap ``choose`` picks (none where ``heatmap_absent`` says why);
    ``img/<id>-<n>.png``: the plots its extra tables ask for (``plot``);
    ``img/<id>-learning.png``: its learning curves, where they part (``curves_differ``).
    """
    card = r.pair.card
    names = []
    choice = choose(r) if r.cells and heatmap_absent(r) is None else None
    if choice is not None:
        panels = weight_panels(choice) if choice.kind == WEIGHTS else output_panels(choice)
        name = f"{IMAGES}/{card.id}.png"
        heatmaps(folder / name, title(choice, card, r.primary, panels), panels)
        names.append(name)
    specs = [(extra, spec) for extra in r.extras for spec in extra.attrs.get("plots", [])]
    for i, (extra, spec) in enumerate(specs, start=1):
        plot_name = f"{IMAGES}/{card.id}-{i}.png"
        plot(folder / plot_name, extra, spec)
        names.append(plot_name)
    if r.learning is not None and curves_differ(r.learning):
        name = f"{IMAGES}/{card.id}-learning.png"
        learning_plot(folder / name, card.id, r.learning)
        names.append(name)
    return names


def plot(path: Path, extra: pd.DataFrame, spec: dict) -> None:
    """One plot an extra table asks for: ``kind`` "lines" (the default, ``line_plot``), "bars"
    (``bar_plot``), or "maps" (``heatmaps`` of the arrays in ``maps``, by panel title, the
    other keys a ``Panel``'s); of the table itself, or of the table in ``data``."""
    spec = dict(spec)
    kind, data = spec.pop("kind", "lines"), spec.pop("data", extra)
    if kind == "maps":
        heading, maps = spec.pop("title"), spec.pop("maps")
        heatmaps(path, heading, [Panel(name, array, **spec) for name, array in maps.items()])
    elif kind == "bars":
        bar_plot(path, data, **spec)
    else:
        line_plot(path, data, **spec)


def unevaluated(run: Run) -> str:
    """Why a run has no attention map to draw."""
    if run.error or run.eval_error:
        return f"raises:\n{run.error or run.eval_error}"
    if (step := run.nonfinite_step) is not None:
        return f"not evaluated: its loss is NaN at step {step}"
    return "returns no attention weights"


def learning_plot(path: Path, trap: str, learning: Learning) -> None:
    """Both modules' training loss per step on one log axis, beside the attention each returns
    after training on the first evaluation row (heads averaged; blocked cells hatched): by
    generation where the bug is wrong only there, else teacher-forced."""
    d = learning.diagnosis
    title = (
        f"{trap}: training on {learning.task.describe()}\nbuggy.py: {d.label} "
        f"(seed {d.first_seed + d.shown} shown)"
    )
    by_generation = d.seeds[d.shown].kind == GENERATION  # where the shown seed's bug shows
    panels = [
        Panel(
            f"{name} after training" + (", by generation" if by_generation else ""),
            as_array(run.generation_attention if by_generation else run.attention),
            unevaluated(run),
            blocked=None if run.attention_blocked is None else run.attention_blocked.numpy(),
        )
        for name, run in (("fixed.py", learning.fix), ("buggy.py", learning.bug))
    ]
    curves = learning.curves()
    if (step := learning.bug.nonfinite_step) is not None:  # a run that ends on its first steps
        curves = curves.rename(columns={"buggy.py loss": f"buggy.py loss (NaN at step {step})"})
    marks = legend(panels)
    if marks:
        title += "\n" + "; ".join(marks)
    lines_beside_heatmaps(
        path,
        title,
        curves,
        x="step",
        y=[c for c in curves.columns if c.endswith("loss") or "loss (" in c],
        panels=panels,
        ylabel="training loss (cross-entropy)",
    )
