"""Report plots a person can read: bands clipped to the metric's range, n in the legend, distinct
styles per regime, and the tables' row names."""

from __future__ import annotations

import math

import numpy as np
from test_report import write_run

from longrange.report import plots as P
from longrange.report.collect import collect_runs
from longrange.report.tables import REGIME_SUFFIX, aggregate, results_table


def _near_ceiling(root):
    """Accuracies close to 1 with a large spread over 3 seeds: the raw 95% band exceeds 100%."""
    for regime, stage, vals in (
        ("scratch", "train", (0.90, 0.99, 1.0)),
        ("masked-spt", "finetune", (0.97, 0.999, 1.0)),
        ("scratch-matched", "train", (0.5, 0.98, 0.99)),
    ):
        for seed, v in enumerate(vals):
            write_run(root, regime=regime, stage=stage, seed=seed, test=v, val=v, curve=((10, v - 0.4), (20, v)))
    return collect_runs([root])


def test_clip_band_to_metric_range():
    lo, hi = P.clip_band("accuracy", np.array([0.98, 0.02]), np.array([0.05, 0.05]))
    assert np.allclose(lo, [0.93, 0.0]) and np.allclose(hi, [1.0, 0.07])
    lo, hi = P.clip_band("loss", np.array([0.1]), np.array([0.3]))
    assert lo[0] == 0.0 and math.isclose(hi[0], 0.4)
    lo, hi = P.clip_band("r2", np.array([0.9]), np.array([0.3]))
    assert math.isclose(lo[0], 0.6) and hi[0] == 1.0
    lo, hi = P.clip_band("something", np.array([5.0]), np.array([np.nan]))
    assert np.isnan(lo[0]) and np.isnan(hi[0])


def test_regime_styles_are_distinct():
    styles = [P.regime_style(r) for r in REGIME_SUFFIX]
    for key in ("color", "linestyle", "marker"):
        values = [repr(s[key]) for s in styles]
        assert len(set(values)) == len(values), key
    assert P.regime_style("scratch") == P.regime_style("scratch")  # fixed across plots


def test_curve_data_clipped_named_as_tables_with_n(tmp_path):
    runs = _near_ceiling(tmp_path)
    (panel,), missing = P.curve_panels(runs)
    assert missing == []
    rows = [r[0] for r in results_table(aggregate(runs)).rows]
    assert sorted(s.name for s in panel.series) == sorted(rows)
    assert [s.legend for s in panel.series] == [f"{s.name} (n=3)" for s in panel.series]
    for s in panel.series:
        band = np.isfinite(s.upper)
        assert band.any() and (s.upper[band] <= 100.0).all() and (s.lower[band] >= 0.0).all()
        assert (s.lower[band] <= s.mean[band] + 1e-9).all() and (s.mean[band] <= s.upper[band] + 1e-9).all()


def test_bar_data_clipped_and_named_as_tables(tmp_path):
    runs = _near_ceiling(tmp_path)
    cells = aggregate(runs)
    (panel,) = P.bar_panels(cells)
    assert sorted(b.name for b in panel.bars) == sorted(r[0] for r in results_table(cells).rows)
    for b in panel.bars:
        assert b.n == 3 and b.upper is not None and b.upper <= 100.0 and b.lower >= 0.0
        assert b.lower <= b.mean <= b.upper
    # the unclipped interval of the widest cell would pass 100%
    wide = max(cells, key=lambda c: c.stat.half_width)
    assert (wide.stat.mean + wide.stat.half_width) * 100 > 100.0


def test_drawn_figure_uses_distinct_styles_clipped_bands_and_row_names(tmp_path, monkeypatch):
    runs = _near_ceiling(tmp_path)
    seen = {}
    real_save = P._save

    def capture(fig, path):
        seen[str(path)] = fig
        ax = fig.axes[0]
        seen["lines"] = [
            (repr(l.get_linestyle()), l.get_marker(), l.get_color())
            for l in ax.get_lines()
            if l.get_label() != "chance"
        ]  # the chance line is drawn beside the regimes' lines
        seen["legend"] = [t.get_text() for t in fig.legends[0].get_texts()] if fig.legends else []
        seen["title"] = ax.get_title()
        seen["bands"] = [poly.get_paths()[0].vertices[:, 1] for poly in ax.collections]
        seen["ticks"] = [t.get_text().replace("\n", " ") for t in ax.get_yticklabels()]
        return real_save(fig, path)

    monkeypatch.setattr(P, "_save", capture)
    assert P.learning_curves(runs, tmp_path / "curves.png").is_file()
    assert len(set(seen["lines"])) == len(seen["lines"]) == 3
    rows = [r[0] for r in results_table(aggregate(runs)).rows]
    # the panel is the model (with its seeds), the legend below the panels its regimes: together a row's name
    label = runs[0].label
    assert seen["title"] == f"{label} (n=3)"
    assert sorted(
        f"{label}{REGIME_SUFFIX[r]}" if r != "scratch" else label for r in ("scratch", "masked-spt", "scratch-matched")
    ) == sorted(rows)
    assert seen["legend"] == ["scratch", "scratch, matched compute", "masked SPT", "chance level 10% (1 in 10)"]
    assert seen["bands"] and all((ys <= 100.0 + 1e-9).all() and (ys >= -1e-9).all() for ys in seen["bands"])
    assert P.scratch_vs_spt_bars(aggregate(runs), tmp_path / "bars.png").is_file()
    assert sorted(seen["ticks"]) == sorted(f"{r} (n=3)" for r in rows)


def test_regime_words_keep_inner_parentheses():
    from longrange.report.plots import regime_words

    assert regime_words("causal-spt-all") == "causal SPT (all inputs)"
    assert regime_words("scratch-matched") == "scratch, matched compute"
    assert regime_words("scratch") == "scratch"
    assert regime_words("masked-spt") == "masked SPT"


def test_accuracy_against_length_draws_each_series_its_mark_and_chance(tmp_path, monkeypatch):
    from longrange.report import plots

    path = plots.accuracy_against(
        {"S6": [(64, 1.0), (128, None), (256, 0.5)], "attention": [(64, None)]},
        tmp_path / "img" / "acc.png",
        "test length",
        "induction heads",
        mark=64,
        chance=0.0625,
    )
    assert path.is_file() and path.stat().st_size > 1000
    kept = {}
    monkeypatch.setattr(plots, "save_figure", lambda fig, p: kept.setdefault("fig", fig))
    plots.accuracy_against({"S6": [(64, 1.0), (128, None), (256, 0.5)]}, tmp_path / "x.png", "L", "t", chance=0.0625)
    ax = kept["fig"].axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["S6"].get_xdata()) == [64, 256] and list(lines["S6"].get_ydata()) == [100.0, 50.0]
    assert list(lines["chance"].get_ydata()) == [6.25, 6.25] and ax.get_xscale() == "log"
