"""PNG charts of the benchmark tables (matplotlib's Agg canvas; no display, no global pyplot state)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

_PANELS = (
    ("train_speed_pct", "training speed"),
    ("train_mem_pct", "training peak memory"),
    ("infer_speed_pct", "inference speed"),
    ("infer_mem_pct", "inference peak memory"),
)


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=90)
    return path


def plot_bench(rows: list[dict[str, Any]], path: str | Path, reference: str, title: str = "") -> Path:
    """Four bar panels: training/inference speed and peak memory of each model, in % of ``reference``.

    Failed models appear with no bar and "failed" at their place.
    """
    names = [r["model"] for r in rows]
    fig = Figure(figsize=(11, 1.6 + 0.45 * len(rows)))
    axes = fig.subplots(2, 2, sharey=True)
    for ax, (column, label) in zip(axes.flat, _PANELS):
        values = [r.get(column) for r in rows]
        ypos = list(range(len(rows)))
        ax.barh(ypos, [v or 0.0 for v in values], color=["tab:red" if n == reference else "tab:blue" for n in names])
        ax.axvline(100.0, color="grey", lw=0.8, ls="--")
        for y, v in zip(ypos, values):
            ax.text((v or 0.0) + 1, y, "failed" if v is None else f"{v:.0f}%", va="center", fontsize=7)
        ax.set_title(f"{label} (% of {reference})", fontsize=9)
        ax.set_yticks(ypos, names, fontsize=8)
        ax.invert_yaxis()
        ax.tick_params(axis="x", labelsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def plot_scaling(
    rows: list[dict[str, Any]], exponents: dict[str, float | None], path: str | Path, title: str = ""
) -> Path:
    """Log-log time per training step and peak memory against length, one line per primitive."""
    fig = Figure(figsize=(11, 4.2))
    ax_t, ax_m = fig.subplots(1, 2)
    for primitive, exponent in exponents.items():
        pts = [r for r in rows if r["primitive"] == primitive and "time_s" in r]
        if not pts:
            continue
        label = primitive + ("" if exponent is None else f" (slope {exponent:.2f})")
        lengths = [r["length"] for r in pts]
        ax_t.plot(lengths, [r["time_s"] for r in pts], marker="o", label=label)
        mem = [(r["length"], r["peak_mb"]) for r in pts if r["peak_mb"] > 0]
        if mem:
            ax_m.plot(*zip(*mem), marker="o", label=primitive)
    for ax, ylabel in ((ax_t, "seconds per training step"), (ax_m, "peak memory increase (MB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def plot_generation(rows: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Per-token latency against position: recurrent step (solid) and recompute (dashed), log-log."""
    fig = Figure(figsize=(7, 4.2))
    ax = fig.subplots()
    models = list(dict.fromkeys(r["model"] for r in rows if "error" not in r))
    colors = [f"C{i % 10}" for i in range(len(models))]
    for model, color in zip(models, colors):
        step = [(r["position"], r["step_ms"]) for r in rows if r["model"] == model and "step_ms" in r]
        naive = [(r["position"], r["recompute_ms"]) for r in rows if r["model"] == model and "recompute_ms" in r]
        if step:
            ax.plot(*zip(*step), marker="o", color=color, label=f"{model} step")
        if naive:
            ax.plot(*zip(*naive), marker="x", ls="--", color=color, label=f"{model} recompute")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("position")
    ax.set_ylabel("ms per generated token")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return _save(fig, path)
