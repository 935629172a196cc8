"""Plots that read at a glance at the largest grid a report makes: no two texts overlap (matplotlib's
renderer, each text's window extent), no legend covers a panel, and the panels of one task share
their axes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from longrange.report import plots as P
from longrange.report.kernels import KernelProfile, KernelReport
from longrange.report.tables import row_name

REGIMES = ("scratch", "scratch-matched", "masked-spt", "causal-spt")
#: Labels as a sweep over configs and widths makes them: long, and many.
LABELS = [
    f"{m} ({c}, d_model={d})" for m, c, d in itertools.product(("Transformer", "S4D"), ("wide", "deep"), (36, 128))
]
TASKS = ("listops", "text")


def _visible_ticks(axis):
    lo, hi = sorted(axis.get_view_interval())
    for tick in axis.get_major_ticks() + axis.get_minor_ticks():
        if tick.label1.get_visible() and tick.label1.get_text().strip() and lo - 1e-9 <= tick.get_loc() <= hi + 1e-9:
            yield tick.label1


def drawn_texts(fig):
    """(what, text, window extent) of every text the figure draws."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = []

    def add(text, what):
        if text is not None and text.get_visible() and text.get_text().strip():
            found.append((what, text.get_text(), text.get_window_extent(renderer)))

    for i, ax in enumerate(fig.axes):
        if not ax.get_visible():
            continue
        for text, what in ((ax.title, "title"), (ax.xaxis.label, "xlabel"), (ax.yaxis.label, "ylabel")):
            add(text, f"axes {i} {what}")
        for axis in (ax.xaxis, ax.yaxis):
            for label in _visible_ticks(axis):
                add(label, f"axes {i} tick")
        for text in ax.texts:
            add(text, f"axes {i} text")
    for k, legend in enumerate(fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]):
        for text in legend.get_texts() + [legend.get_title()]:
            add(text, f"legend {k}")
    add(fig._suptitle, "suptitle")
    return found


def assert_legible(fig):
    texts = drawn_texts(fig)
    assert len(texts) > 10
    box = np.array([t[2].extents for t in texts]) + [0.5, 0.5, -0.5, -0.5]  # touching edges are not an overlap
    x0, y0, x1, y1 = (box[:, k] for k in range(4))
    clash = (
        (x0[:, None] < x1[None, :])
        & (x0[None, :] < x1[:, None])
        & (y0[:, None] < y1[None, :])
        & (y0[None, :] < y1[:, None])
    )
    clash[np.tril_indices(len(texts))] = False  # each pair once, no text with itself
    for i, j in zip(*np.nonzero(clash)):
        raise AssertionError(f"{texts[i][0]} {texts[i][1]!r} overlaps {texts[j][0]} {texts[j][1]!r}")
    renderer = fig.canvas.get_renderer()
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    for legend in legends:  # legends outside the data
        box = legend.get_window_extent(renderer).padded(-0.5)
        for ax in fig.axes:
            if ax.get_visible():
                assert not box.overlaps(ax.get_window_extent(renderer)), "a legend covers a panel"
    P.plt.close(fig)


def _series(regime, n, seed):
    rng = np.random.default_rng(seed)
    steps = np.linspace(0, 1000, 60)
    mean = np.clip(30 + 40 * (1 - np.exp(-steps / 300)) + rng.normal(0, 1, steps.size), 0, 100)
    return P.Series(row_name("x", regime), regime, n, steps, mean, mean - 3, mean + 3)


def test_learning_curves_at_the_largest_grid_share_axes_and_never_overlap():
    panels = [
        P.CurvePanel(task, label, "accuracy", "", "accuracy (%)", [_series(r, 3, k) for r in REGIMES])
        for k, (task, label) in enumerate(itertools.product(TASKS, LABELS))
    ]
    fig = P.curves_figure(panels)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == len(TASKS) * len(LABELS)
    for t in range(len(TASKS)):  # one y axis per task: the models compared by eye
        block = visible[t * len(LABELS) : (t + 1) * len(LABELS)]
        assert len({ax.get_ylim() for ax in block}) == 1 and len({ax.get_xlim() for ax in block}) == 1
    assert not any(ax.get_legend() for ax in fig.axes) and len(fig.legends) == 1
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "scratch",
        "scratch, matched compute",
        "causal SPT",
        "masked SPT",
    ]
    assert_legible(fig)


def test_bars_at_the_largest_grid_are_horizontal_and_never_overlap():
    panels = []
    for task in TASKS:
        bars, x = [], 0.0
        for label in LABELS:
            for regime in REGIMES:
                bars.append(P.Bar(row_name(label, regime), regime, x, 55.0, 50.0, 60.0, 3))
                x += 1.0
            x += 0.6
        panels.append(P.BarPanel(task, f"{task}: test accuracy (%)", "accuracy (%)", bars))
    fig = P.bars_figure(panels)
    names = [t.get_text().replace("\n", " ") for t in fig.axes[0].get_yticklabels()]
    assert names[0] == "Transformer (wide, d_model=36) (n=3)" and len(names) == len(LABELS) * len(REGIMES)
    assert_legible(fig)


def _kernel_report(seed, layers=6, length=256):
    rng = np.random.default_rng(seed)
    profiles = []
    for layer in range(layers):
        for direction in ("forward", "backward"):
            env = np.exp(-np.arange(length) / rng.uniform(5, 50))
            profiles.append(
                KernelProfile(layer, f"backbone.blocks.{layer}.mixer", "S4D", direction, env, 10.0, 30, 0.1)
            )
    return KernelReport(profiles, [], length)


def test_kernel_decay_at_the_largest_grid_keeps_its_legend_off_the_curves():
    reports = {
        f"{row_name('S4D (wide, d_model=128)', r)}, subset {s!r}": (r, [_kernel_report(k), _kernel_report(k + 1)])
        for k, (r, s) in enumerate(itertools.product(REGIMES, (0.1, 1.0)))
    }
    fig = P.kernel_figure(P.kernel_lines(reports), title="listops: S4D (wide, d_model=128), kernel envelope")
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 6 and len({ax.get_ylim() for ax in visible}) == 1
    assert len(fig.legends) == 1 and len(fig.legends[0].get_texts()) == 16
    assert_legible(fig)


def test_sweep_plot_at_a_large_grid_never_overlaps(tmp_path, monkeypatch):
    from test_verdict_sweep import put_run

    from longrange.report.collect import collect_runs
    from longrange.report.sweep import split_by_subset, sweep_plot

    for task, label, regime, subset, seed in itertools.product(
        TASKS[:2], LABELS[:6], REGIMES[:3], (0.1, 0.3, 1.0), (0, 1)
    ):
        put_run(
            tmp_path,
            task=task,
            label=label,
            regime=regime,
            subset=subset,
            size=int(1000 * subset),
            seed=seed,
            test=0.5 + 0.1 * subset + 0.01 * seed,
        )
    seen = {}
    monkeypatch.setattr(P, "_save", lambda fig, path: seen.setdefault("fig", fig) and path)
    assert sweep_plot(split_by_subset(collect_runs([tmp_path], warn=lambda m: None)), tmp_path / "sweep.png")
    assert len(seen["fig"].legends) == 1
    assert_legible(seen["fig"])
    # A tick at each training fraction (0.1, 0.3, 1), none between them (no 2x10^-1, 4x10^-1, ...).
    ax = next(ax for ax in seen["fig"].axes if ax.get_visible())
    assert [t.get_loc() for t in ax.xaxis.get_major_ticks() if t.label1.get_text()] == [0.1, 0.3, 1.0]
    assert [t.label1.get_text() for t in ax.xaxis.get_major_ticks()] == ["0.1", "0.3", "1"]
    assert not ax.xaxis.get_minor_ticks() or not any(t.label1.get_text() for t in ax.xaxis.get_minor_ticks())


def _closed_figures(monkeypatch) -> list:
    """The figures a plot function closes once saved (left open, to be checked)."""
    closed = []
    monkeypatch.setattr(P.plt, "close", lambda fig=None: closed.append(fig))
    return closed


def test_label_curves_at_the_largest_grid_label_close_sizes_without_overlap(tmp_path, monkeypatch):
    """Accuracy against labelled examples: a tick at every training size; 400 and 500 (and 800, 1000)
    sit too close on a log axis for both labels, so the second is left unlabelled."""
    from test_verdict_sweep import put_run

    from longrange.report.collect import collect_runs
    from longrange.report.ranking import label_curves

    sizes = (400, 500, 800, 1000, 8000, 96000)
    for task, label, regime, size, seed in itertools.product(TASKS, LABELS, REGIMES[:2], sizes, (0, 1)):
        put_run(
            tmp_path / "runs",
            task=task,
            label=label,
            regime=regime,
            subset=size,
            size=size,
            seed=seed,
            test=0.5 + 0.01 * seed + size / 1e6,
        )
    closed = _closed_figures(monkeypatch)
    assert label_curves(collect_runs([tmp_path / "runs"], warn=lambda m: None), tmp_path / "labels.png").is_file()
    fig = closed[0]
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == len(TASKS) * len(LABELS) and len({ax.get_ylim() for ax in visible}) == 1
    # listops and text: chance 10% and 50%, one dashed line per panel, one legend entry
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "scratch",
        "scratch, matched compute",
        "chance level (per task)",
    ]
    ticks = [t for t in visible[0].xaxis.get_major_ticks() if t.label1.get_text()]
    assert [t.get_loc() for t in ticks] == list(sizes)  # every size keeps its tick
    shown = [t.label1.get_text() for t in ticks if t.label1.get_visible()]
    assert shown[0] == "400" and shown[-1] == "96,000" and "500" not in shown
    assert_legible(fig)


@pytest.mark.parametrize(
    "values", [[2**k for k in range(6, 18)], [2**k for k in range(6, 21)], [100, 128, 150, 200, 256]]
)
def test_extrapolation_plot_of_many_lengths_and_runs_never_overlaps(tmp_path, monkeypatch, values):
    """``longrange extrapolate``: 12 lengths, each labelled, beside a legend of 8 runs had 512 over 1024."""
    from longrange.report import extrapolation as E

    rows = [
        E.RunRow(
            f"runs/{i}",
            f"{label}, seed {i % 3}",
            "listops",
            "accuracy",
            values[len(values) // 2],
            [E.ValueResult(v, {"accuracy": 0.3 + 0.02 * i + 0.01 * k}) for k, v in enumerate(values)],
        )
        for i, label in enumerate(LABELS)
    ]
    closed = _closed_figures(monkeypatch)
    E.sweep_plot(E.Sweep("seq_len", values, "test", {}, rows), tmp_path / "extrapolation.png")
    fig = closed[0]
    assert len(fig.axes) == 1 and len(fig.axes[0].get_legend().get_texts()) == len(LABELS)
    assert_legible(fig)


@pytest.mark.parametrize("draw", ["curves", "bars"])
def test_the_checker_finds_overlapping_texts(draw):
    """The check can fail: the earlier layout (vertical bars, 30° labels; legends inside) did."""
    fig, ax = P.plt.subplots(figsize=(3, 2))
    if draw == "bars":
        ax.bar(range(12), np.ones(12))
        ax.set_xticks(range(12))
        ax.set_xticklabels([f"{label} + masked SPT (n=3)" for label in LABELS[:12] * 2][:12], rotation=30, ha="right")
    else:
        for r in REGIMES:
            ax.plot([0, 1], [0, 1], label=f"a long legend entry for {r}")
        ax.legend()
    with pytest.raises(AssertionError):
        assert_legible(fig)
