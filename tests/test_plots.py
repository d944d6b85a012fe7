"""The report's pictures show their trap: the cell, batch row and map where the bug is visible.

Each trap is measured once on the CPU without the trigger search (a few traps, a second each);
figures are inspected before they are written by catching them at ``plots.save``.
"""

import re
from dataclasses import replace
from functools import cache
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch

from harness import plots
from harness.catalogue.judge import Measurement, measure
from harness.catalogue.learn import learn
from harness.catalogue.registry import load
from harness.catalogue.sources import source_map
from harness.report import TrapResult, choice, pictures
from harness.report.choice import OUTPUT, WEIGHTS, choose, faintness, heatmap_absent

CPU = torch.device("cpu")
DTYPES = {"float32": torch.float32, "float16": torch.float16}


@cache
def cell(pitfall: str, dtype: str = "float32") -> Measurement:
    return measure(load(pitfall), CPU, DTYPES[dtype], search=False)


def result(pitfall: str, *dtypes: str) -> TrapResult:
    return TrapResult(load(pitfall), [cell(pitfall, d) for d in dtypes or ("float32",)])


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[plt.Figure]:
    """Every figure ``plots`` saves from now on, kept open for inspection."""
    caught = []

    def keep(fig: plt.Figure, path: Path) -> None:
        caught.append(fig)
        path.write_bytes(b"\x89PNG stub")

    monkeypatch.setattr(plots, "save", keep)
    yield caught
    for fig in caught:
        plt.close(fig)


def images(fig: plt.Figure) -> list:
    """The heatmaps of a figure (one per panel that has data)."""
    return [image for ax in fig.axes for image in ax.images]


def test_the_nan_batch_row_is_drawn_for_fully_masked_row() -> None:
    """The all-padding sequence is batch row 1; batch row 0 looks the same in both modules."""
    r = result("fully_masked_row")
    choice = choose(r)
    bug = choice.cell.weights["bug"]
    assert choice.kind == WEIGHTS and choice.index == (1,)
    assert bug[1].isnan().all() and not bug[0].isnan().any()
    assert "batch row 1 (of 0-1)" in pictures.title(choice, r.pair.card, r.primary, [])


def test_the_nan_batch_row_is_drawn_for_padding_on_queries(
    tmp_path: Path, figures: list[plt.Figure]
) -> None:
    (tmp_path / "img").mkdir()
    pictures.draw(result("padding_on_queries"), tmp_path)
    [fig] = figures
    fix, bug = (image.get_array() for image in images(fig))
    assert bug.mask.any() and not fix.mask.any()  # NaN cells are masked out (and painted red)
    assert "batch row 1 (of 0-1)" in fig._suptitle.get_text()


@pytest.mark.parametrize("pitfall", ["qk_overflow_half", "fill_overflow_half"])
def test_a_float16_only_trap_is_drawn_in_float16(pitfall: str, tmp_path: Path, figures) -> None:
    r = result(pitfall, "float32", "float16")
    assert str(r.primary.verdict) == "BENIGN"
    choice = choose(r)
    assert choice.cell.dtype == "float16" and choice.cell is r.cells[1]
    (tmp_path / "img").mkdir()
    pictures.draw(r, tmp_path)
    [fig] = figures
    heading = fig._suptitle.get_text()
    assert "cpu float16" in heading and "BENIGN in float32" in heading
    if choice.cell.edge:  # qk_overflow_half: measured on large activations, where it breaks
        assert "edge inputs: large activations" in heading
        assert "red = NaN" in heading


def test_an_output_assembled_wrong_is_drawn_as_output(tmp_path: Path, figures) -> None:
    """head_merge_no_transpose: identical weights, scrambled output; the picture is the output."""
    r = result("head_merge_no_transpose")
    m = r.primary
    assert torch.equal(m.weights["fix"], m.weights["bug"])
    choice = choose(r)
    assert choice.kind == OUTPUT
    (tmp_path / "img").mkdir()
    assert pictures.draw(r, tmp_path) == ["img/head_merge_no_transpose.png"]
    [fig] = figures
    fix, bug, error = (image.get_array() for image in images(fig))
    b = choice.index[0]
    assert np.allclose(fix, m.outputs["fix"][b].numpy(), atol=1e-3)
    assert np.allclose(bug, m.outputs["bug"][b].numpy(), atol=1e-3)
    assert np.allclose(error, np.abs(bug - fix), atol=1e-3) and error.max() > 0.1
    labels = [image.colorbar.ax.get_ylabel() for image in images(fig)]
    assert labels == ["output value", "output value", "|buggy - fixed| output"]
    assert "output" in fig._suptitle.get_text()


@pytest.mark.parametrize("pitfall", ["fully_masked_row", "head_merge_no_transpose", "mask_rank"])
def test_ticks_are_whole_positions_and_colour_bars_are_labelled(
    pitfall: str, tmp_path: Path, figures
) -> None:
    (tmp_path / "img").mkdir()
    pictures.draw(result(pitfall), tmp_path)
    [fig] = figures
    fig.canvas.draw()
    assert images(fig)
    for image in images(fig):
        ax = image.axes
        for ticks, labels in ((ax.get_xticks(), ax.get_xticklabels()),
                              (ax.get_yticks(), ax.get_yticklabels())):  # fmt: skip
            assert len(ticks) and all(float(t).is_integer() and t >= 0 for t in ticks)
            assert all(re.fullmatch(r"\d+", label.get_text()) for label in labels)
        assert image.colorbar is not None and image.colorbar.ax.get_ylabel()


def test_a_two_by_two_map_has_integer_ticks(tmp_path: Path, figures) -> None:
    """Left to matplotlib, a 2 x 2 map (a trigger shape) is ticked -0.5, 0.0, 0.5, ..., 1.5."""
    plots.heatmaps(tmp_path / "x.png", "t", [plots.Panel("p", np.eye(2))])
    [fig] = figures
    fig.canvas.draw()
    [image] = images(fig)
    assert [label.get_text() for label in image.axes.get_xticklabels()] == ["0", "1"]
    assert list(image.axes.get_yticks()) == [0, 1]
    assert image.colorbar.ax.get_ylabel() == "attention weight"


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((folder / "img").glob("*.png"))}


def jittered(m: Measurement) -> Measurement:
    """``m`` with every weight and output moved in its last float32 bits, as on another CPU."""

    def jitter(t: torch.Tensor | None, seed: int) -> torch.Tensor | None:
        if t is None:
            return None
        noise = torch.randn(t.shape, generator=torch.Generator().manual_seed(seed), dtype=t.dtype)
        return t * (1 + 1e-7 * noise)

    return replace(
        m,
        weights={k: jitter(t, i) for i, (k, t) in enumerate(m.weights.items())},
        outputs={k: jitter(t, 9 + i) for i, (k, t) in enumerate(m.outputs.items())},
    )


@pytest.mark.parametrize("pitfall", ["padding_on_queries", "head_merge_no_transpose"])
def test_same_measurement_same_bytes_even_in_the_last_bits(pitfall: str, tmp_path: Path) -> None:
    r = result(pitfall)
    for name in ("a", "b", "jittered"):
        (tmp_path / name / "img").mkdir(parents=True)
    assert pictures.draw(r, tmp_path / "a") == pictures.draw(r, tmp_path / "b")
    other = TrapResult(r.pair, [jittered(m) for m in r.cells])
    assert not torch.equal(other.primary.outputs["fix"], r.primary.outputs["fix"])
    pictures.draw(other, tmp_path / "jittered")
    first = files(tmp_path / "a")
    assert first and first == files(tmp_path / "b") == files(tmp_path / "jittered")
    assert all(data.startswith(b"\x89PNG") for data in first.values())


def test_the_last_bits_do_not_reach_the_picture(tmp_path: Path) -> None:
    """0.5 sits on a colour boundary of the map: 1e-7 below it, unrounded, is the next colour."""
    data = np.array([[0.5, 0.25], [0.75, 0.125]])
    for name, values in (("exact", data), ("below", data * (1 - 1e-7))):
        plots.heatmaps(tmp_path / f"{name}.png", "t", [plots.Panel("p", values)])
    assert (tmp_path / "exact.png").read_bytes() == (tmp_path / "below.png").read_bytes()


def test_line_plots_are_numbered_after_the_heatmap(tmp_path: Path) -> None:
    table = pd.DataFrame({"d_k": [8, 16], "a": [0.5, 0.25]})
    table.attrs["plots"] = [dict(x="d_k", y=["a"], title="t", logx=True)] * 2
    r = TrapResult(load("mask_bool"), [cell("mask_bool")], extras=[table])
    (tmp_path / "img").mkdir()
    names = pictures.draw(r, tmp_path)
    assert names == ["img/mask_bool.png", "img/mask_bool-1.png", "img/mask_bool-2.png"]
    assert all((tmp_path / n).read_bytes().startswith(b"\x89PNG") for n in names)


# --- pictures that show the claim ---------------------------------------------------------------


def with_extra(pitfall: str) -> TrapResult:
    """The trap's float32 cell and its card's own table, as the report measures them."""
    pair = load(pitfall)
    return TrapResult(pair, [cell(pitfall)], extras=[pair.card.extra(pair, CPU, torch.float32)])


def test_a_heatmap_that_would_show_nothing_is_not_drawn(tmp_path: Path) -> None:
    """scale_precision's modules agree to the drawn decimals, and a scatter of its 1- and 2-ulp
    points would read as a gap: it has no picture."""
    r = with_extra("scale_precision")
    assert choose(r).same and "would show nothing" in heatmap_absent(r)
    (tmp_path / "img").mkdir()
    assert pictures.draw(r, tmp_path) == []
    assert heatmap_absent(result("mask_bool")) is None


def test_a_benign_traps_healthy_maps_are_not_drawn_side_by_side(tmp_path: Path) -> None:
    """init_variance: the default init's near-uniform map beside xavier's sharper one would
    read as the fault the tutorial claims."""
    r = result("init_variance")
    assert not choose(r).same and "does not exist" in heatmap_absent(r)
    (tmp_path / "img").mkdir()
    assert pictures.draw(r, tmp_path) == []


def test_a_difference_too_faint_to_see_is_not_drawn(monkeypatch: pytest.MonkeyPatch) -> None:
    r = result("mask_bool")  # its maps differ by a whole weight
    assert faintness(choose(r)) == pytest.approx(1.0, abs=0.05) and heatmap_absent(r) is None
    monkeypatch.setattr(choice, "VISIBLE", 1.5)  # a difference of one weight as too faint
    assert "too faint" in heatmap_absent(r)
    monkeypatch.undo()
    capped = result("softcap_after_mask")  # the cap moves the weights by a few hundredths
    assert 0 < faintness(choose(capped)) < choice.VISIBLE and "too faint" in heatmap_absent(capped)


def test_the_key_bias_gradient_is_drawn_as_bars(tmp_path: Path, figures) -> None:
    (tmp_path / "img").mkdir()
    pictures.draw(with_extra("qkv_bias"), tmp_path)
    [fig] = figures
    [ax] = fig.axes
    bars = zip(ax.get_xticklabels(), ax.patches, strict=True)
    heights = {label.get_text(): bar.get_height() for label, bar in bars}
    assert set(heights) == {"W_q.bias", "W_k.bias", "W_v.bias"}
    assert heights["W_k.bias"] < 1e-5 * min(heights["W_q.bias"], heights["W_v.bias"])


@pytest.mark.parametrize("pitfall", ["head_split_view", "head_merge_no_transpose"])
def test_the_source_map_puts_a_correct_layout_on_the_diagonal(pitfall: str) -> None:
    pair = load(pitfall)
    shape = pair.card.shape
    maps = {
        name: source_map(pair.card.build(module, shape), shape.seq_len, shape.heads)
        for name, module in (("fixed", pair.fixed), ("buggy", pair.buggy))
    }
    n = shape.seq_len * shape.heads
    assert list(maps["fixed"].argmax(axis=1)) == list(range(n))
    moved = maps["buggy"].argmax(axis=1)
    assert sorted(moved) == list(range(n))  # a permutation: each input block goes somewhere once
    assert (moved != np.arange(n)).sum() >= n - 2  # all but the first and the last move
    for m in maps.values():  # one block each: the others are rounding
        second = np.sort(m, axis=1)[:, -2]
        assert second.max() < 1e-3 * m.max()


def test_the_source_maps_are_drawn_side_by_side(tmp_path: Path, figures) -> None:
    (tmp_path / "img").mkdir()
    names = pictures.draw(with_extra("head_split_view"), tmp_path)
    assert names[-1] == "img/head_split_view-1.png"
    fix, bug = (image.get_array() for image in images(figures[-1]))
    assert fix.shape == bug.shape == (20, 20) and not np.array_equal(fix, bug)


def test_no_learning_picture_where_the_curves_run_together(tmp_path: Path) -> None:
    r = result("scale_d_model")  # learns normally: buggy.py's curve is fixed.py's, near enough
    r.learning = learn(load("scale_d_model"), steps=40)
    assert r.learning.bug.trained and r.learning.diagnosis.kind == "learns normally"
    (tmp_path / "img").mkdir()
    assert not [n for n in pictures.draw(r, tmp_path) if "learning" in n]
    r.learning = learn(load("mask_bool"), steps=40)  # too good to be true: they part
    assert [n for n in pictures.draw(r, tmp_path) if "learning" in n]


def test_no_learning_picture_for_a_bug_that_raises_before_training(tmp_path: Path) -> None:
    r = result("mask_rank")
    r.learning = learn(load("mask_rank"), steps=3)
    assert not r.learning.bug.trained
    (tmp_path / "img").mkdir()
    assert not [n for n in pictures.draw(r, tmp_path) if "learning" in n]


def test_the_shown_seed_wrong_in_generation_is_drawn_by_generation(figures, tmp_path: Path) -> None:
    """A mixed tally shows its first seed: where that seed's bug shows decides the picture."""
    learned = learn(load("cache_causal_alignment"))
    wrong = learned.diagnosis.seeds[0]
    assert wrong.kind == "wrong in generation"
    normal = replace(wrong, label="learns normally (×1)")
    learned.diagnosis = replace(learned.diagnosis, seeds=(wrong, normal, wrong, normal, normal))
    assert learned.diagnosis.kind == "mixed" and learned.diagnosis.shown == 0
    pictures.learning_plot(tmp_path / "learning.png", "cache_causal_alignment", learned)
    titles = [ax.get_title() for ax in figures[-1].axes]
    assert any(title.endswith("by generation") for title in titles), titles
    learned.diagnosis = replace(learned.diagnosis, seeds=(normal, wrong, wrong, normal, normal))
    pictures.learning_plot(tmp_path / "learning.png", "cache_causal_alignment", learned)
    titles = [ax.get_title() for ax in figures[-1].axes]
    assert not any(title.endswith("by generation") for title in titles), titles


def test_hatched_and_red_cells_are_one_patch_each_over_exactly_their_cells(
    figures, tmp_path: Path
) -> None:
    values = np.full((4, 5), 0.5)
    values[2, 1:3] = np.nan
    blocked = np.triu(np.ones((4, 5), dtype=bool), 1)
    plots.heatmaps(tmp_path / "cells.png", "t", [plots.Panel("p", values, blocked=blocked)])
    (fig,) = figures
    hatched, red = fig.axes[0].patches
    assert hatched.get_hatch() == "///" and not hatched.get_fill()
    for patch, where in ((hatched, blocked), (red, ~np.isfinite(values))):
        outline = patch.get_path()
        inside = [[outline.contains_point((j, i)) for j in range(5)] for i in range(4)]
        assert (np.array(inside) == where).all()
