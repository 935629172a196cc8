"""The report of finished runs: ``report.md`` with the tables, the plots and the kernel analysis.

from longrange.report import write_report
print(write_report(["runs/"], out_dir="runs/"))     # also writes runs/report.md and PNGs
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from longrange.errors import ConfigError, LongrangeError
from longrange.report.aggregate import regime_sort_key, row_name, task_sort_key
from longrange.report.collect import Run, collect, failed_section
from longrange.report.environment import mixing_warnings
from longrange.report.render import Table, render_markdown
from longrange.train.rundir import other_versions_line

REPORT_FILE = "report.md"
DEFAULT_KERNEL_LENGTH = 1024


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "run"


def kernel_length_of(run: Run, default: int = DEFAULT_KERNEL_LENGTH) -> int:
    """The sequence length of a run's task, from its config (``task.options.seq_len`` or
    ``model.max_len``), else ``default``."""
    cfg = run.config
    task = cfg.get("task")
    options = task.get("options") if isinstance(task, dict) else None
    seq_len = options.get("seq_len") if isinstance(options, dict) else None
    if isinstance(seq_len, int) and not isinstance(seq_len, bool) and seq_len > 0:
        return seq_len
    model = cfg.get("model")
    max_len = model.get("max_len") if isinstance(model, dict) else None
    if isinstance(max_len, int) and not isinstance(max_len, bool) and max_len > 0:
        return max_len
    return default


def kernel_section(
    runs: Sequence[Run], out_dir: Path | None, length: int | None, warn: Callable[[str], None], plots: bool = True
) -> str:
    """Markdown of the kernel decay analysis of final-stage runs, grouped by (task, label), with a
    log-log plot per group in ``out_dir``. Runs whose model cannot be loaded are named in the text."""
    from longrange.report.kernels import kernel_decay
    from longrange.train.trained import load_model

    final = sorted(
        (r for r in runs if r.is_final),
        key=lambda r: (task_sort_key(r.task), r.label, regime_sort_key(r.regime), r.seed),
    )
    groups: dict[tuple[str, str], list[tuple[Run, Any]]] = {}
    problems = []
    for r in final:
        L = length or kernel_length_of(r)
        try:
            rep = kernel_decay(load_model(r.path), L)
        except LongrangeError as err:
            problems.append(f"- {r.path}: model not analysed: {err}")
            warn(f"kernel analysis of {r.path} failed: {err}")
            continue
        groups.setdefault((r.task, r.label), []).append((r, rep))

    lines = [
        "## Convolution kernel decay",
        "",
        "Per layer: envelope e_l = mean over channels of |K_l|, divided by its maximum; "
        "centre of mass Σ l·e_l / Σ e_l (in steps); cutoff = first lag after the peak with "
        "e_l < 0.1 (— if none within the kernel length L).",
        "",
    ]
    table = Table(
        "Kernel decay per run",
        ["Model", "Task", "Seed", "L", "Layer", "Direction", "Centre of mass", "Cutoff (0.1)"],
        [],
    )
    notes = []
    for (task, label), items in groups.items():
        for r, rep in items:
            if not rep.has_kernels:
                notes.append(f"- {row_name(r.label, r.regime)}, {task}, seed {r.seed}: {rep.message()}")
                continue
            if rep.without_kernel:
                notes.append(f"- {row_name(r.label, r.regime)}, {task}, seed {r.seed}: {rep.message()}")
            for p in rep.profiles:
                table.rows.append(
                    [
                        row_name(r.label, r.regime),
                        task,
                        str(r.seed),
                        str(rep.length),
                        f"{p.layer} ({p.primitive})",
                        p.direction,
                        f"{p.centre_of_mass:.1f}",
                        "—" if p.cutoff is None else str(p.cutoff),
                    ]
                )
        if plots and out_dir is not None:
            from longrange.report.plots import kernel_decay_plot

            rows: dict[str, tuple[str, list[Any]]] = {}
            sweep = len({repr(r.train_subset) for r, _ in items}) > 1
            for r, rep in items:  # one legend entry per row of the tables (and subset), its seeds as thin lines
                name = row_name(r.label, r.regime) + (f", subset {r.train_subset!r}" if sweep else "")
                rows.setdefault(name, (r.regime, []))[1].append(rep)
            png = kernel_decay_plot(
                rows, out_dir / f"kernels_{_slug(task)}_{_slug(label)}.png", title=f"{task}: {label}, kernel envelope"
            )
            if png is not None:
                lines.append(f"![kernel decay, {task}, {label}]({png.name})")
                lines.append("")
    if table.rows:
        lines.append(render_markdown(table))
    lines.extend(notes + problems)
    return "\n".join(lines) + "\n"


def write_report(
    paths: Sequence[str | Path],
    out_dir: str | Path | None = None,
    *,
    plots: bool = True,
    kernels: bool = False,
    kernel_length: int | None = None,
    csv_path: str | Path | None = None,
    warn: Callable[[str], None] | None = None,
    text_format: str = "md",
) -> str:
    """Collect the runs under ``paths``, write ``report.md`` (and PNGs, and the CSV if asked) and
    return the tables as text: Markdown (``text_format="md"``) or CSV (``"csv"``).

    ``out_dir`` None writes nothing but the CSV. Warnings (unfinished runs, runs without curves)
    go to ``warn`` (default: stderr) and into ``report.md``.
    """
    return _write_report(
        paths,
        out_dir,
        plots=plots,
        kernels=kernels,
        kernel_length=kernel_length,
        csv_path=csv_path,
        warn=warn,
        text_format=text_format,
    )[0]


def _write_report(
    paths, out_dir, *, plots=True, kernels=False, kernel_length=None, csv_path=None, warn=None, text_format="md"
) -> tuple[str, list, list]:
    """:func:`write_report`, returning also the runs it collected and their rankings."""
    from longrange.report.ranking import rankings

    warnings: list[str] = []

    def note(message: str) -> None:
        warnings.append(message)
        if warn is not None:
            warn(message)
        else:
            print(f"warning: {message}", file=sys.stderr)

    if text_format not in ("md", "csv"):
        raise ConfigError(f"report format must be md or csv, got {text_format!r}")
    found = collect(paths)  # failed or unfinished runs: listed apart with their reason, never in the tables
    runs = found.runs
    if found.failed:
        note(
            f"{len(found.failed)} failed or unfinished run(s) left out of the tables (see 'Failed or unfinished runs')"
        )
    other = other_versions_line([r.version for r in runs], "runs")
    if other:
        note(other)
    from longrange.report import sweep
    from longrange.report.verdict import verdict_markdown

    groups = sweep.split_by_subset(runs)  # one group unless the runs are a data-fraction sweep
    for message in (m for g in groups for m in mixing_warnings(g.cells)):
        note(message)
    tables = sweep.sweep_tables(groups) + ("\n" + failed_section(found.failed) if found.failed else "")
    if csv_path is not None:
        sweep.write_sweep_csv(groups, csv_path)
    text = tables if text_format == "md" else sweep.sweep_csv_text(groups)
    ranked = rankings(runs)
    if out_dir is None:
        return text, runs, ranked
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    from longrange.report.ranking import label_curves, ranking_section

    body = [tables, verdict_markdown(runs), ranking_section(ranked)]
    if plots:
        from longrange.report import plots as P

        images = [
            ("metric against the training subset", sweep.sweep_plot(groups, out / "sweep.png", warn=note)),
            ("metric against the labelled examples, per model", label_curves(runs, out / "labels.png")),
        ]
        for g in groups:  # per subset when the runs are a sweep
            suffix, what = (g.file_suffix, f", {g.title.lower()}") if sweep.is_sweep(groups) else ("", "")
            final = [r for r in g.runs if r.is_final]
            pre = [r for r in g.runs if not r.is_final]
            if final:
                images.append(
                    (
                        f"learning curves{what}",
                        P.learning_curves(final, out / f"learning_curves{suffix}.png", warn=note),
                    )
                )
            if pre:
                images.append(
                    (
                        f"pretraining curves{what}",
                        P.learning_curves(pre, out / f"pretraining_curves{suffix}.png", warn=note),
                    )
                )
            images.append(
                (f"scratch vs self-pretraining{what}", P.scratch_vs_spt_bars(g.cells, out / f"bars{suffix}.png"))
            )
        shown = [f"![{name}]({png.name})" for name, png in images if png is not None]
        if shown:
            body.append("## Plots\n\n" + "\n\n".join(shown) + "\n")
    if kernels:
        body.append(kernel_section(runs, out, kernel_length, note, plots=plots))

    source_list = ", ".join(str(p) for p in paths)
    head = [f"# Report\n\n{len(runs)} finished runs under {source_list}.\n"]
    if warnings:
        head.append("Warnings:\n\n" + "\n".join(f"- {w}" for w in warnings) + "\n")
    (out / REPORT_FILE).write_text("\n".join(head + body))
    return text, runs, ranked


def report_and_verdict(out_dir: str | Path, *, kernels: bool = False) -> str:
    """Write the report of the runs under ``out_dir`` into it and return what ``compare`` and the demo
    print: the tables, then the verdict lines, then the order of the models under each regime
    (when two or more models are compared)."""
    from longrange.report.ranking import ranking_text
    from longrange.report.verdict import verdict_text

    out = Path(out_dir)
    tables, runs, ranked = _write_report([out], out, kernels=kernels)
    ranking = ranking_text(ranked)
    return tables + "\n" + verdict_text(runs) + ("\n" + ranking if ranking else "")
