"""Pictures for the report: attention heatmaps, buggy and fixed side by side."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle
from torch import Tensor

HATCH = "white"  # blocked cells: white hatching over the weight's own colour
NAN = "#d62728"  # NaN cells: red


def first_map(weights: Tensor | None) -> np.ndarray | None:
    """The (T, T) map of batch element 0 (head 0 for multi-head weights)."""
    if weights is None:
        return None
    w = weights
    while w.dim() > 2:
        w = w[0]
    return w.double().numpy()


def _panel(ax, data: np.ndarray | None, keep: np.ndarray | None, title: str, note: str) -> None:
    ax.set_title(title, fontsize=10)
    if data is None:
        text = "\n".join(textwrap.fill(line, 44) for line in note.splitlines())
        ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    blocked = np.zeros_like(data, dtype=bool) if keep is None or keep.shape != data.shape else ~keep
    nan = np.isnan(data)
    image = ax.imshow(np.ma.masked_where(nan, data), cmap="viridis", vmin=0, vmax=1)
    for i, j in zip(*np.nonzero(blocked), strict=True):
        cell = Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", ec=HATCH, lw=0)
        ax.add_patch(cell)
    for i, j in zip(*np.nonzero(nan), strict=True):
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, color=NAN))
        ax.text(j, i, "NaN", ha="center", va="center", color="white", fontsize=7)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)


def heatmap(
    path: Path,
    title: str,
    fix: Tensor | None,
    bug: Tensor | None,
    keep: Tensor | None,
    bug_note: str = "",
) -> None:
    """Write a PNG: fixed.py's weights left, buggy.py's right; blocked cells hatched.

    Every weight keeps its colour, so weight that leaks onto a blocked cell shows under the
    hatching; NaN cells are red.
    """
    keep_map = None if keep is None else keep[0].numpy()
    fig, axes = plt.subplots(1, 2, figsize=(8.5, 3.8))
    _panel(axes[0], first_map(fix), keep_map, "fixed.py", "")
    _panel(axes[1], first_map(bug), keep_map, "buggy.py", bug_note)
    fig.suptitle(
        f"{title}: attention weights (batch 0, head 0; hatched = blocked, red = NaN)", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=80, metadata={"Software": None})
    plt.close(fig)


def line_plot(
    path: Path, data, x: str, y: list[str], title: str, logx: bool = False, ylabel: str = ""
) -> None:
    """Write a PNG of columns ``y`` of ``data`` against column ``x``."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for column in y:
        ax.plot(data[x], data[column], marker="o", label=column)
    if logx:
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(data[x]), [str(v) for v in data[x]])
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=80, metadata={"Software": None})
    plt.close(fig)
