"""Plain drawing: heatmap panels side by side, and line plots, written as PNG files.

What to draw is chosen elsewhere (``harness.report.choice``). Every number drawn is rounded
first (``harness.drawn``), so float32 results that differ in the last bits from CPU to CPU draw the
same bytes; PNGs are written without a software tag, so the same data always gives the same file.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.patches import PathPatch
from matplotlib.path import Path as Outline

from harness.drawn import rounded, significant

HATCH = "white"  # blocked cells: white hatching over the cell's own colour
NAN = "#d62728"  # NaN and Inf cells: red
MAX_TICKS = 10  # at most this many tick labels per axis
MAX_NAN_LABELS = 10  # write "NaN" in the cells only up to this many columns
DPI = 80
FEW_POINTS = 5  # a line with fewer finite points than this is drawn with markers


@dataclass(frozen=True)
class Panel:
    """One heatmap: a 2-D array (or a note in its place), its colours and its labels."""

    title: str
    data: np.ndarray | None  # 2-D; None: ``note`` is written in the panel instead
    note: str = ""
    label: str = "attention weight"  # the colour bar's label
    vmin: float = 0.0
    vmax: float = 1.0
    cmap: str = "viridis"
    blocked: np.ndarray | None = None  # bool, same shape as data: cells to hatch
    xlabel: str = "key"
    ylabel: str = "query"


def integer_ticks(ax: Axes, rows: int, cols: int) -> None:
    """Tick the cells of a ``rows`` x ``cols`` image at whole positions only, 0-based."""
    for n, setter in ((cols, ax.set_xticks), (rows, ax.set_yticks)):
        step = -(-n // MAX_TICKS)  # ceil: at most MAX_TICKS labels
        setter(range(0, n, step), [str(i) for i in range(0, n, step)])


def draw_note(ax: Axes, note: str) -> None:
    """Write ``note`` in the middle of an empty panel, wrapped."""
    text = "\n".join(textwrap.fill(line, 44) for line in note.splitlines())
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])


def cells(where: np.ndarray) -> Outline:
    """One path around every cell where ``where`` is True (unit squares at the image's pixels)."""
    square = np.array([(-0.5, -0.5), (0.5, -0.5), (0.5, 0.5), (-0.5, 0.5), (-0.5, -0.5)])
    rows, cols = np.nonzero(where)
    vertices = square[None] + np.stack([cols, rows], axis=1)[:, None]  # (cells, 5, 2)
    codes = [Outline.MOVETO] + [Outline.LINETO] * 3 + [Outline.CLOSEPOLY]
    return Outline(vertices.reshape(-1, 2), codes * len(rows))


def mark_cells(ax: Axes, blocked: np.ndarray | None, values: np.ndarray) -> None:
    """Hatch the ``blocked`` cells (their colour shows through); paint NaN and Inf cells red.

    Each kind of cell is one patch: a patch per cell made most of a picture's time."""
    nan = ~np.isfinite(values)
    if blocked is not None and blocked.shape == nan.shape and blocked.any():
        ax.add_patch(PathPatch(cells(blocked), fill=False, hatch="///", ec=HATCH, lw=0))
    if not nan.any():
        return
    ax.add_patch(PathPatch(cells(nan), color=NAN))
    if nan.shape[1] > MAX_NAN_LABELS:
        return
    for i, j in zip(*np.nonzero(nan), strict=True):
        text = f"{values[i, j]:g}".replace("nan", "NaN").replace("inf", "Inf")
        ax.text(j, i, text, ha="center", va="center", color="white", fontsize=7)


def legend(panels: list[Panel]) -> list[str]:
    """The key to the marks ``draw_panel`` makes on ``panels``: only those that appear."""
    marks = []
    if any(p.data is not None and p.blocked is not None and p.blocked.any() for p in panels):
        marks.append("hatched = blocked by the intended mask")
    found = [rounded(p.data) for p in panels if p.data is not None]
    if any(np.isnan(d).any() for d in found):
        marks.append("red = NaN")
    if any(np.isinf(d).any() for d in found):
        marks.append("red = Inf")
    return marks


def draw_panel(ax: Axes, panel: Panel) -> None:
    """One heatmap: integer ticks, hatched blocked cells, red NaN and Inf, a labelled colour bar."""
    ax.set_title(panel.title, fontsize=10)
    if panel.data is None:
        draw_note(ax, panel.note)
        return
    data = rounded(panel.data)
    nan = ~np.isfinite(data)
    image = ax.imshow(
        np.ma.masked_where(nan, data), cmap=panel.cmap, vmin=panel.vmin, vmax=panel.vmax
    )
    mark_cells(ax, panel.blocked, data)
    integer_ticks(ax, *data.shape)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    bar = ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.02)
    bar.set_label(panel.label, fontsize=8)


def save(fig: plt.Figure, path: Path) -> None:
    """Write ``fig`` as a PNG with no software tag (the same figure, the same bytes); close it."""
    fig.savefig(path, format="png", dpi=DPI, metadata={"Software": None})
    plt.close(fig)


GAP = 0.95  # inches between stacked panels: a panel's title above, its axis label below


def fixed_layout(fig: plt.Figure, heading: float, across: int, down: int = 1) -> None:
    """Margins and gaps in inches, set once: what constrained layout would find for these
    figures, without its search over every text's extent (most of a picture's drawing time).
    ``heading``: inches of title; ``across`` and ``down``: panels in a row and a column."""
    width, height = fig.get_size_inches()
    top, bottom = 1 - (heading + 0.45) / height, 0.55 / height
    panel = ((top - bottom) * height - GAP * (down - 1)) / down  # inches of one stacked panel
    fig.subplots_adjust(
        left=0.7 / width, right=1 - 0.6 / width, bottom=bottom, top=top,
        wspace=0.4 if across > 1 else 0.2, hspace=GAP / panel if down > 1 else 0.2,
    )  # fmt: skip


def heatmaps(path: Path, title: str, panels: list[Panel]) -> None:
    """Write a PNG of ``panels`` under ``title`` (one or more lines).

    Side by side; stacked one above the other when a panel is much wider than tall (a (T, d)
    output with few positions and many features).
    """
    shapes = [p.data.shape for p in panels if p.data is not None]
    wide = any(cols > 1.5 * rows for rows, cols in shapes)
    heading = 0.2 * (title.count("\n") + 1)  # inches of title
    n = len(panels)
    if wide:
        rows, cols = max(shapes)  # an image as wide as the axes: 7 inches of 9
        size = (9.0, n * 7.0 * rows / cols + GAP * (n - 1) + heading + 1.0)
        fig, axes = plt.subplots(n, 1, figsize=size)
        fixed_layout(fig, heading, 1, n)
    else:
        size = (4.25 * n, 3.3 + heading)
        fig, axes = plt.subplots(1, n, figsize=size)
        fixed_layout(fig, heading, n)
    for ax, panel in zip(np.atleast_1d(axes), panels, strict=True):
        draw_panel(ax, panel)
    fig.suptitle(title, fontsize=10)
    save(fig, path)


def draw_lines(
    ax: Axes,
    data: pd.DataFrame,
    x: str,
    y: list[str],
    logx: bool = False,
    logy: bool = False,
    marker: str | None = "o",
    xlabel: str = "",
    ylabel: str = "",
    points: bool = False,
) -> None:
    """Columns ``y`` of ``data`` against column ``x`` on ``ax``, rounded (``significant``).

    With ``logy`` values of 0 are left out (a log axis has no 0); the legend says so. NaN
    values are not drawn (a run that ended early). ``points``: marks only, no lines (values
    that jump from one x to the next), a circle for the first column and a cross after.
    """
    xs = significant(data[x])
    for i, column in enumerate(y):
        ys = significant(data[column])
        label = column
        if logy and any(v == 0 for v in ys):
            ys, label = [math.nan if v == 0 else v for v in ys], f"{column} (0 not drawn)"
        few = sum(map(math.isfinite, ys)) < FEW_POINTS  # a run that ended at once: dots
        style = "-" if i == 0 else "--"  # a second line that matches the first stays visible
        mark, fill = marker or ("o" if few else None), "full"
        if points:
            style, mark, fill = "none", "ox"[min(i, 1)], "none"
        ax.plot(xs, ys, marker=mark, linestyle=style, label=label, fillstyle=fill)
    if logx:
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(data[x]), [str(v) for v in data[x]])
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel or x)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if points:  # values on a few levels: the legend between the top two
        ax.legend(fontsize=8, loc="center", bbox_to_anchor=(0.5, 0.75))
    else:
        ax.legend(fontsize=8)


def line_plot(
    path: Path,
    data: pd.DataFrame,
    x: str,
    y: list[str],
    title: str,
    logx: bool = False,
    ylabel: str = "",
    logy: bool = False,
    xlabel: str = "",
    marker: str | None = "o",
    points: bool = False,
) -> None:
    """Write a PNG of columns ``y`` of ``data`` against column ``x`` (``draw_lines``)."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    draw_lines(ax, data, x, y, logx, logy, marker, xlabel, ylabel, points)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    save(fig, path)


def bar_plot(
    path: Path, data: pd.DataFrame, x: str, y: str, title: str, ylabel: str = "", logy: bool = False
) -> None:
    """Write a PNG of one bar per row of ``data``: column ``y`` (rounded, ``significant``) over
    the labels in column ``x``, each bar's value written above it."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    values = significant(data[y])
    bars = ax.bar([str(v) for v in data[x]], values)
    ax.bar_label(bars, [f"{v:.3g}" for v in values], fontsize=8)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel or y)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    save(fig, path)


def lines_beside_heatmaps(
    path: Path,
    title: str,
    data: pd.DataFrame,
    x: str,
    y: list[str],
    panels: list[Panel],
    ylabel: str = "",
) -> None:
    """Write a PNG of a log-scale line plot (no markers) with heatmap ``panels`` beside it."""
    n = len(panels)
    heading = 0.2 * (title.count("\n") + 1)  # inches of title
    size = (5.5 + 3.6 * n, 3.6 + heading)
    widths = [1.5] + [1.0] * n
    fig, axes = plt.subplots(1, n + 1, figsize=size, width_ratios=widths)
    fixed_layout(fig, heading, n + 1)
    draw_lines(axes[0], data, x, y, logy=True, marker=None, ylabel=ylabel)
    for ax, panel in zip(axes[1:], panels, strict=True):
        draw_panel(ax, panel)
    fig.suptitle(title, fontsize=10)
    save(fig, path)
