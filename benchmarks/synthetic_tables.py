"""The synthetic-task tables of the Mamba paper and Zoology at CPU scale (docs/synthetic-tasks.md).

Four tables, each from the CPU-scale presets (``mamba/selective-copying/cpu/*``,
``mamba/induction-heads/cpu/*``, ``zoology/mqar/cpu/*``; their budgets and the rule that fixed them
are in the presets' ``cpu/_base.yaml``):

* ``table1``: selective copying at length 256 for S4, S4D, DLR and S6 in the Simple ("no gate") and
  Mamba blocks and attention with absolute and rotary positions (the Mamba paper's Table 1);
* ``lengths``: selective copying with 16 data tokens at lengths 64 ... 1024 at the same budget, for
  S6, S4D and DLR in the Simple block and attention: where the models part (table and plot);
* ``induction``: induction heads trained at length 256, the best weights evaluated at 2^6 ... 2^20
  through ``longrange extrapolate`` (the paper's Table 11; table and plot);
* ``mqar``: MQAR over Zoology's (length, key-value pairs) cells at width 64 (``--widths 64,128`` adds
  128) for attention, Mamba-S6 and time-invariant SSMs (Zoology's Figure 2).

    python benchmarks/synthetic_tables.py table1 --jobs 1
    python benchmarks/synthetic_tables.py lengths --jobs 1
    python benchmarks/synthetic_tables.py induction --jobs 1
    python benchmarks/synthetic_tables.py mqar --jobs 1 [--widths 64,128]
    python benchmarks/synthetic_tables.py all --jobs 1       # the four, in this order
    python benchmarks/synthetic_tables.py report [TABLE...]  # the tables of what has finished

Every grid runs from scratch through the experiment layer (the plan, the scheduler and local worker
processes with one thread each), into ``runs/synthetic/<task>`` (``--out``); running a command again
reuses the finished runs, resumes interrupted ones and runs the rest. ``table1`` and ``lengths``
share one grid (the length-256 runs of the lengths table are table1's). Each command then writes the
raw per-run results and the tables to ``benchmarks/results/synthetic_*`` (``--results``) and prints
the tables. ``--tiny`` runs the same code at toy sizes (seconds; the test of this script).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SEED = 0
RESULTS = Path(__file__).resolve().parent / "results"
TASK_DIRS = {"copying": "selective-copying", "induction": "induction-heads", "mqar": "mqar"}

# ------------------------------------------------------------------------------------ the grids
TABLE1_MODELS = ["simple-s4", "simple-s4d", "simple-dlr", "simple-s6", "mamba-s4", "mamba-s4d", "mamba-dlr",
                 "mamba-s6", "attention-abs", "attention-rope"]
TABLE1_LENGTH = 256
LENGTH_MODELS = ["simple-s6", "simple-s4d", "simple-dlr", "attention-rope"]
LENGTHS = [64, 128, 256, 512, 1024]
INDUCTION_MODELS = ["mamba-s6", "simple-s6", "mamba-s4d", "simple-s4d", "attention-abs", "attention-rope"]
TRAIN_LENGTH = 256
EXTRAPOLATION_LENGTHS = [2 ** k for k in range(6, 21)]
#: Attention is evaluated up to 2^14, as in the paper: its time grows with the square of the length
#: (hours per sequence of 2^20 on one core), although its memory would reach 2^21 here.
ATTENTION_MAX_LENGTH = 2 ** 14
#: Sequences evaluated at length L: 2^18 tokens, between 16 and 256 sequences.
EVAL_TOKENS, EVAL_MIN, EVAL_MAX = 2 ** 18, 16, 256
MEMORY_BUDGET = "12GiB"
MQAR_MODELS = ["attention", "mamba-s6", "mamba-s4d", "simple-s4d", "simple-dlr"]
MQAR_CELLS = [(64, 4), (128, 8), (256, 16), (512, 64)]
MQAR_TOKENS = 4096  # tokens per step (batch = MQAR_TOKENS // length)

# The published figures (percent). Mamba paper Table 1 (architecture, layer); Table 11 (2^6 ... 2^20);
# Zoology Figure 2 at widths 64 and 128, read off the figure (assets/figure2.png) to about 0.03.
TABLE1_PAPER = {"simple-s4": 18.3, "simple-s6": 97.0, "mamba-s4": 56.4, "mamba-s6": 99.8}
TABLE1_PAPER_OTHER = [("H3", "S4", 57.0), ("H3", "Hyena", 30.1), ("H3", "S6", 99.7), ("Mamba", "Hyena", 28.4)]
TABLE11_PAPER = {  # as printed: ✓ perfect accuracy, ✗ out of memory
    "MHA-Abs (137K)": ["✓", "99.6", "100.0", "58.6", "26.6", "18.8", "9.8", "10.9", "7.8"] + ["✗"] * 6,
    "MHA-RoPE (137K)": ["✓", "✓", "100.0", "83.6", "31.3", "18.4", "8.6", "9.0", "5.5"] + ["✗"] * 6,
    "MHA-xPos (137K)": ["✓", "✓", "100.0", "99.6", "67.6", "25.4", "7.0", "9.0", "7.8"] + ["✗"] * 6,
    "H3 (153K)": ["✓", "✓", "100.0", "80.9", "39.5", "23.8", "14.8", "8.2", "5.9", "6.6", "8.2", "4.7", "8.2", "6.3",
                  "7.4"],
    "Hyena (69M)": ["97.7", "✓", "100.0", "✓", "44.1", "12.5", "6.6", "5.1", "7.0", "5.9", "6.6", "6.6", "5.9", "6.3",
                    "9.8"],
    "Mamba (74K)": ["✓", "✓", "100.0"] + ["✓"] * 12,
}
FIGURE2_PAPER = {  # width -> model -> accuracy at (64, 4), (128, 8), (256, 16), (512, 64)
    64: {"Attention": [1.0, 1.0, 1.0, 1.0], "Hyena": [0.51, 0.17, 0.04, 0.01], "RWKV": [0.76, 0.17, 0.04, 0.01],
         "H3": [0.92, 0.25, 0.06, 0.01], "BaseConv": [0.70, 0.37, 0.13, 0.01]},
    128: {"Attention": [1.0, 1.0, 1.0, 1.0], "Hyena": [0.75, 0.64, 0.13, 0.02], "RWKV": [0.93, 0.50, 0.05, 0.02],
          "H3": [0.99, 0.73, 0.64, 0.02], "BaseConv": [0.93, 0.62, 0.35, 0.02]},
}


@dataclass
class Scale:
    """The sizes a run of the script uses: the published CPU scale, or toy sizes (``--tiny``)."""

    table1_models: list[str]
    table1_length: int
    length_models: list[str]
    lengths: list[int]
    induction_models: list[str]
    train_length: int
    extrapolation: list[int]
    attention_max: int
    eval_tokens: int
    eval_min: int
    eval_max: int
    mqar_models: list[str]
    mqar_cells: list[tuple[int, int]]
    mqar_tokens: int
    #: MQAR widths run unless --widths says otherwise.
    widths: list[int]
    #: Overrides on top of each grid's presets (none at CPU scale).
    copying: list[str] = field(default_factory=list)
    induction: list[str] = field(default_factory=list)
    mqar: list[str] = field(default_factory=list)


CPU = Scale(TABLE1_MODELS, TABLE1_LENGTH, LENGTH_MODELS, LENGTHS, INDUCTION_MODELS, TRAIN_LENGTH,
            EXTRAPOLATION_LENGTHS, ATTENTION_MAX_LENGTH, EVAL_TOKENS, EVAL_MIN, EVAL_MAX, MQAR_MODELS, MQAR_CELLS,
            MQAR_TOKENS, [64])
_TOY = ["train.max_steps=2", "train.eval_every=0", "train.batch_size=4", "train.log_every=1", "model.d_model=16",
        "task.options.n_train=8", "task.options.n_val=4", "task.options.n_test=4"]  # d_model: --widths for mqar
TINY = Scale(["simple-s6", "attention-rope"], 24, ["simple-s6", "attention-rope"], [16, 24],
             ["mamba-s6", "attention-abs"], 16, [8, 16, 32, 64], 32, 64, 2, 4,
             ["attention", "mamba-s6"], [(16, 2), (32, 4)], 64, [16],
             copying=_TOY + ["task.options.n_tokens=4"], induction=_TOY,
             mqar=_TOY + ["task.options.vocab_size=64"])


@dataclass
class Cell:
    """One training run of a grid: a preset with overrides, under its own label."""

    model: str
    preset: str
    label: str
    overrides: list[str]
    info: dict[str, Any]

    def experiment(self):
        from longrange.experiment.config import resolve

        return resolve(self.preset, overrides=[*self.overrides, f"label={self.label}"])


def _label(preset: str) -> str:
    from longrange.experiment.config import resolve

    return resolve(preset).label


def copying_cell(model: str, length: int, scale: Scale) -> Cell:
    preset = f"mamba/selective-copying/cpu/{model}"
    over = [f"task.options.seq_len={length}", *scale.copying]
    if model.endswith("-s4"):
        over.append(f"model.primitive_options.l_max={length}")
    cell = Cell(model, preset, f"{_label(preset)} L={length}", over, {"seq_len": length})
    options = cell.experiment().task.options
    cell.info.update(n_tokens=options["n_tokens"], vocab_size=options["vocab_size"])
    return cell


def copying_cells(scale: Scale, which: str) -> list[Cell]:
    """table1: every model at the table's length; lengths: the length models at every length, the
    shortest first (attention at the longest last: the dearest run)."""
    if which == "table1":
        return [copying_cell(m, scale.table1_length, scale) for m in scale.table1_models]
    return [copying_cell(m, length, scale) for length in scale.lengths for m in scale.length_models]


def induction_cells(scale: Scale) -> list[Cell]:
    cells = []
    for m in scale.induction_models:
        preset = f"mamba/induction-heads/cpu/{m}"
        cell = Cell(m, preset, _label(preset), [f"task.options.seq_len={scale.train_length}", *scale.induction],
                    {"seq_len": scale.train_length})
        cell.info["vocab_size"] = cell.experiment().task.options["vocab_size"]
        cells.append(cell)
    return cells


def mqar_cells(scale: Scale, widths: list[int]) -> list[Cell]:
    cells = []
    for width in widths:
        for length, pairs in scale.mqar_cells:
            for m in scale.mqar_models:
                preset = f"zoology/mqar/cpu/{m}"
                over = [f"task.options.seq_len={length}", f"task.options.n_pairs={pairs}",
                        f"train.batch_size={max(1, scale.mqar_tokens // length)}", *scale.mqar, f"model.d_model={width}"]
                if m == "attention":
                    over.append(f"model.max_len={length}")
                cells.append(Cell(m, preset, f"{_label(preset)} L={length} d={width}", over,
                                  {"seq_len": length, "n_pairs": pairs, "d_model": width}))
    return cells


# ------------------------------------------------------------------------------ running a grid
def plan_of(cells: list[Cell]):
    """The grid's plan: each cell's training from scratch (seed 0), no self-pretraining."""
    from longrange.experiment.plan import Plan, plan_grid

    plan = plan_grid([c.experiment() for c in cells], seeds=[SEED], compute_matched=False)
    return Plan(plan.experiments, [s for s in plan.stages if s.regime == "scratch"])


def run_grid(cells: list[Cell], grid: list[Cell], out_dir: Path, jobs: int) -> list[str]:
    """Train ``cells`` (a part of ``grid``, whose plan is saved) with ``jobs`` local workers of one
    thread each; returns the ids of the stages that did not finish."""
    from longrange.experiment.backends import LocalWorkers
    from longrange.experiment.compare import check_reuse
    from longrange.experiment.plan import Plan
    from longrange.experiment.scheduler import Outcome, run_plan
    from longrange.train.rundir import Intent

    plan = plan_of(grid)
    labels = {c.label for c in cells}
    part = Plan(plan.experiments, [s for s in plan.stages if plan.experiments[s.experiment].label in labels])
    out_dir.mkdir(parents=True, exist_ok=True)
    check_reuse(part, out_dir)
    plan.save(out_dir)
    start = time.time()
    outcome = run_plan(part, out_dir, LocalWorkers(jobs=jobs, threads_per_job=1), intent=Intent("continue"))
    print(f"== {out_dir}: {len(part.stages)} stages, {(time.time() - start) / 60:.1f} min", file=sys.stderr, flush=True)
    return [i for i, o in outcome.items() if o is not Outcome.DONE]


def stage_dir(out_dir: Path, cell: Cell) -> Path:
    from longrange.experiment.plan import slug

    exp = cell.experiment()
    return out_dir / slug(exp.task.name) / slug(exp.label) / "scratch" / f"seed{SEED}"


def run_row(table: str, cell: Cell, out_dir: Path) -> dict[str, Any]:
    """A cell's settings and, once finished, its result (None fields while it is not)."""
    from longrange.report.collect import read_run
    from longrange.train.rundir import RunDir, RunState

    exp = cell.experiment()
    train = exp.train_config("train")
    path = stage_dir(out_dir, cell)
    row = {"table": table, "model": cell.model, "label": _label(cell.preset), "preset": cell.preset,
           "overrides": cell.overrides, **cell.info, "block": exp.model.block, "primitive": exp.model.primitive,
           "d_model": exp.model.d_model, "lr": train.lr, "batch_size": train.batch_size, "max_steps": train.max_steps,
           "run": str(path), "state": RunDir(path).state().kind.value, "params": None, "steps": None, "seconds": None,
           "val_accuracy": None, "test_accuracy": None, "test_sequence_accuracy": None}
    if RunDir(path).state().kind is RunState.FINISHED:
        r = read_run(path)
        test = r.test or {}
        row.update(params=r.params_total, steps=r.steps, seconds=round(r.seconds, 1),
                   val_accuracy=r.best_val.get("accuracy"), test_accuracy=test.get("accuracy"),
                   test_sequence_accuracy=test.get("sequence_accuracy"))
    return row


# ----------------------------------------------------------------------------- extrapolation
def eval_count(length: int, scale: Scale) -> int:
    return max(scale.eval_min, min(scale.eval_max, scale.eval_tokens // length))


def is_attention(model: str) -> bool:
    return model.startswith("attention")


def extrapolation_groups(cells: list[Cell], out_dir: Path, scale: Scale) -> list[tuple[list[int], int, list[str]]]:
    """(lengths, test sequences, runs) of each ``longrange extrapolate`` command: the finished runs
    (attention up to ``attention_max``) at consecutive lengths that share the number of sequences."""
    groups: list[tuple[list[int], int, list[str]]] = []
    for length in scale.extrapolation:
        runs = [str(stage_dir(out_dir, c)) for c in cells
                if (stage_dir(out_dir, c) / "summary.json").is_file()
                and not (is_attention(c.model) and length > scale.attention_max)]
        n = eval_count(length, scale)
        if not runs:
            continue
        if groups and groups[-1][1:] == (n, runs):
            groups[-1][0].append(length)
        else:
            groups.append(([length], n, runs))
    return groups


def extrapolation_dir(out_dir: Path, lengths: list[int]) -> Path:
    return out_dir / "extrapolation" / ("L" + "-".join(str(n) for n in lengths))


def extrapolate(cells: list[Cell], out_dir: Path, scale: Scale) -> list[str]:
    """``longrange extrapolate`` of the finished runs at every length, one command per group of
    :func:`extrapolation_groups`; a group whose output holds the same runs and lengths is not
    evaluated again. Returns the groups whose command failed."""
    failed = []
    for lengths, n, runs in extrapolation_groups(cells, out_dir, scale):
        dest = extrapolation_dir(out_dir, lengths)
        done = dest / "extrapolation.json"
        if done.is_file():
            old = json.loads(done.read_text())
            same_runs = sorted(str(Path(r["run"]).resolve()) for r in old["runs"]) == sorted(str(Path(r).resolve()) for r in runs)
            if old["values"] == lengths and same_runs:  # the same runs, however the output directory was named
                continue
        values = ",".join(str(v) for v in lengths)
        cmd = [sys.executable, "-m", "longrange", "extrapolate", *runs, "--option", "seq_len", "--values", values,
               "--task-option", f"n_test={n}", "--memory-budget", MEMORY_BUDGET, "--out", str(dest), "--no-plot"]
        print(f"== extrapolate at {values} ({n} sequences each): {len(runs)} runs", file=sys.stderr, flush=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)  # its progress on stderr, live
        print(proc.stdout, file=sys.stderr, flush=True)  # its table: ours is printed at the end
        if proc.returncode:
            failed.append(f"extrapolate at seq_len {values}")
    return failed


def extrapolation_rows(cells: list[Cell], out_dir: Path, scale: Scale) -> list[dict[str, Any]]:
    """One row per run and length: the test accuracy, the sequences and seconds, or why none."""
    # matched however the output directory was named; each row names its run as the grid's rows do
    by_run = {str(stage_dir(out_dir, c).resolve()): c for c in cells}
    named = {key: str(stage_dir(out_dir, c)) for key, c in by_run.items()}
    rows = []
    seen = set()
    # the newest evaluation of a run at a length wins (a group re-run with more runs supersedes an older one)
    for path in sorted((out_dir / "extrapolation").glob("L*/extrapolation.json"), key=lambda p: -p.stat().st_mtime):
        for run in json.loads(path.read_text())["runs"]:
            key = str(Path(run["run"]).resolve())
            cell = by_run.get(key)
            if cell is None:
                continue
            for c in run["cells"]:
                if (key, c["value"]) in seen or c["value"] not in scale.extrapolation:
                    continue
                seen.add((key, c["value"]))
                ev = c.get("evaluation") or {}
                rows.append({"model": cell.model, "label": _label(cell.preset), "run": named[key],
                             "trained_at": run["trained_at"], "seq_len": c["value"],
                             "accuracy": (c.get("metrics") or {}).get("accuracy"), "items": ev.get("items"),
                             "batch_size": ev.get("batch_size"), "seconds": ev.get("seconds"), "error": c.get("error")})
    rows.sort(key=lambda r: (list(named.values()).index(r["run"]), r["seq_len"]))
    return rows


# ---------------------------------------------------------------------------------- tables
def pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}"


def minutes(s: float | None) -> str:
    return "—" if s is None else f"{s / 60:.1f}"


def table1_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | block | layer | params | Table 1 | ours: test accuracy | val accuracy | steps | train min |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        block = {"simple": "Simple (no gate)", "mamba": "Mamba", "transformer": "Transformer"}[r["block"]]
        paper = TABLE1_PAPER.get(r["model"])
        layer = r["primitive"].upper() if r["primitive"] != "attention" else r["label"]
        lines.append(f"| {r['label']} | {block} | {layer} | {r['params'] or '—'} | {'—' if paper is None else paper} | "
                     f"{pct(r['test_accuracy'])} | {pct(r['val_accuracy'])} | {r['steps'] or '—'} | {minutes(r['seconds'])} |")
    lines.append("")
    if rows:
        lines.append(f"Chance: {100 / (rows[0]['vocab_size'] - 2):.1f}% (the data tokens are uniform over "
                     f"{rows[0]['vocab_size'] - 2}). "
                     "Table 1's other rows (not expressible here): " +
                     ", ".join(f"{a}-{layer} {v}" for a, layer, v in TABLE1_PAPER_OTHER) + ".")
        return "\n".join(lines)
    lines.append("Table 1's other rows (not expressible here): " +
                 ", ".join(f"{a}-{layer} {v}" for a, layer, v in TABLE1_PAPER_OTHER) + ".")
    return "\n".join(lines)


def lengths_markdown(rows: list[dict[str, Any]], lengths: list[int]) -> str:
    models = list(dict.fromkeys(r["label"] for r in rows))
    cell = {(r["label"], r["seq_len"]): r for r in rows}
    tokens = rows[0]["n_tokens"] if rows else 16
    head = "| model | " + " | ".join(f"L={n} (noise:data {(n - 2 * tokens) / tokens:g})" for n in lengths) + " |"
    chance = f" Chance: {100 / (rows[0]['vocab_size'] - 2):.1f}%." if rows else ""
    lines = [f"Test accuracy (%); training minutes in parentheses.{chance}", "", head, "|---|" + "---:|" * len(lengths)]
    for m in models:
        cells = []
        for n in lengths:
            r = cell.get((m, n))
            cells.append("—" if r is None or r["test_accuracy"] is None
                         else f"{pct(r['test_accuracy'])} ({minutes(r['seconds'])})")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def induction_markdown(train_rows: list[dict[str, Any]], ext_rows: list[dict[str, Any]], lengths: list[int],
                       attention_max: int) -> str:
    at = train_rows[0]["seq_len"] if train_rows else "?"
    lines = [f"| model | params | lr | steps | val accuracy at {at} | train min | evaluation min (all lengths) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in train_rows:
        spent = [e["seconds"] for e in ext_rows if e["run"] == r["run"] and e["seconds"] is not None]
        lines.append(f"| {r['label']} | {r['params'] or '—'} | {r['lr']:g} | {r['steps'] or '—'} | "
                     f"{pct(r['val_accuracy'])} | {minutes(r['seconds'])} | {minutes(sum(spent)) if spent else '—'} |")
    cell = {(r["run"], r["seq_len"]): r for r in ext_rows}
    notes: dict[str, int] = {}
    head = "| model | " + " | ".join(f"2^{int(math.log2(n))}" for n in lengths) + " |"
    chance = f" Chance: {100 / (train_rows[0]['vocab_size'] - 1):.1f}%." if train_rows else ""
    lines += ["", f"Test accuracy (%) against the test length; * the training length; (n) see the notes.{chance}", "",
              head, "|---|" + "---:|" * len(lengths)]
    for r in train_rows:
        cells = []
        for n in lengths:
            e = cell.get((r["run"], n))
            if e is None:
                cells.append("not run" if is_attention(r["model"]) and n > attention_max else "—")
            elif e["error"]:
                cells.append(f"— ({notes.setdefault(e['error'], len(notes) + 1)})")
            else:
                cells.append(pct(e["accuracy"]) + ("*" if n == e["trained_at"] else ""))
        lines.append(f"| {r['label']} | " + " | ".join(cells) + " |")
    for name, values in TABLE11_PAPER.items():
        if len(lengths) == len(values):
            lines.append(f"| paper: {name} | " + " | ".join(str(v) for v in values) + " |")
    counts = {n: next((e["items"] for e in ext_rows if e["seq_len"] == n and e["items"]), None) for n in lengths}
    lines += ["", "Sequences evaluated per length: " + ", ".join(f"2^{int(math.log2(n))}: {c}" for n, c in counts.items()
                                                              if c) + "."]
    lines += [f"({k}) {reason}" for reason, k in notes.items()]
    return "\n".join(lines)


def mqar_markdown(rows: list[dict[str, Any]], cells: list[tuple[int, int]]) -> str:
    head = "| model | width | " + " | ".join(f"({n}, {p})" for n, p in cells) + " |"
    lines = ["Test accuracy (%) at (length, key-value pairs); training minutes in parentheses.", "", head,
             "|---|---:|" + "---:|" * len(cells)]
    by = {(r["label"], r["d_model"], r["seq_len"]): r for r in rows}
    for label, width in dict.fromkeys((r["label"], r["d_model"]) for r in rows):
        out = []
        for n, _ in cells:
            r = by.get((label, width, n))
            out.append("—" if r is None or r["test_accuracy"] is None
                       else f"{pct(r['test_accuracy'])} ({minutes(r['seconds'])})")
        lines.append(f"| {label} | {width} | " + " | ".join(out) + " |")
    if [c for c in cells] == MQAR_CELLS:
        for width, models in FIGURE2_PAPER.items():
            for name, values in models.items():
                lines.append(f"| Zoology: {name} | {width} | " + " | ".join(f"≈{100 * v:.0f}" for v in values) + " |")
    return "\n".join(lines)


def accuracy_plot(series: dict[str, list[tuple[int, float | None]]], path: Path, xlabel: str, title: str,
                  mark: int | None = None) -> Path:
    """Accuracy (%) against a length on a log2 axis, one line per model; ``mark``: a dashed line there."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from longrange.report.plots import LINESTYLES, MARKERS

    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    xs_all = sorted({x for pts in series.values() for x, _ in pts})
    for i, (name, pts) in enumerate(series.items()):
        pts = [(x, 100 * y) for x, y in pts if y is not None]
        if pts:
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker=MARKERS[i % len(MARKERS)],
                    linestyle=LINESTYLES[i % len(LINESTYLES)], label=name)
    if mark is not None:
        ax.axvline(mark, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    if xs_all and len(xs_all) <= 8:
        ax.set_xticks(xs_all, [str(x) for x in xs_all])
        ax.minorticks_off()
    ax.set_ylim(-2, 102)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize="medium")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small", frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------- the commands
def write_results(name: str, data: dict[str, Any], markdown: str, results: Path) -> None:
    results.mkdir(parents=True, exist_ok=True)
    (results / f"synthetic_{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    (results / f"synthetic_{name}.md").write_text(markdown + "\n")
    print(markdown)
    print(f"wrote {results / f'synthetic_{name}.json'} and .md", file=sys.stderr)


def copying_grid(scale: Scale) -> list[Cell]:
    grid = copying_cells(scale, "table1")
    labels = {c.label for c in grid}
    return grid + [c for c in copying_cells(scale, "lengths") if c.label not in labels]


def do_table1(args, scale: Scale) -> list[str]:
    out = args.out / TASK_DIRS["copying"]
    cells = copying_cells(scale, "table1")
    failed = [] if args.report_only else run_grid(cells, copying_grid(scale), out, args.jobs)
    rows = [run_row("table1", c, out) for c in cells]
    md = f"## Selective copying at length {scale.table1_length} (the Mamba paper's Table 1)\n\n" + table1_markdown(rows)
    write_results("table1", {"runs": rows}, md, args.results)
    return failed


def do_lengths(args, scale: Scale) -> list[str]:
    out = args.out / TASK_DIRS["copying"]
    cells = copying_cells(scale, "lengths")
    failed = [] if args.report_only else run_grid(cells, copying_grid(scale), out, args.jobs)
    rows = [run_row("lengths", c, out) for c in cells]
    tokens = rows[0]["n_tokens"] if rows else "?"
    md = (f"## Selective copying against length ({tokens} data tokens, the same budget)\n\n"
          + lengths_markdown(rows, scale.lengths))
    series: dict[str, list] = {}
    for r in rows:
        series.setdefault(r["label"], []).append((r["seq_len"], r["test_accuracy"]))
    if any(y is not None for pts in series.values() for _, y in pts):
        png = accuracy_plot(series, args.results / "synthetic_lengths.png", "sequence length (16 data tokens)",
                            "selective copying at a fixed budget")
        md += f"\n\n![selective copying against length]({png.name})"
    write_results("lengths", {"runs": rows}, md, args.results)
    return failed


def do_induction(args, scale: Scale) -> list[str]:
    out = args.out / TASK_DIRS["induction"]
    cells = induction_cells(scale)
    failed = [] if args.report_only else run_grid(cells, cells, out, args.jobs)
    if not args.report_only:
        failed += extrapolate(cells, out, scale)
    rows = [run_row("induction", c, out) for c in cells]
    ext = extrapolation_rows(cells, out, scale)
    md = (f"## Induction heads trained at {scale.train_length}, tested at other lengths (the Mamba paper's Table 11)\n\n"
          + induction_markdown(rows, ext, scale.extrapolation, scale.attention_max))
    series: dict[str, list] = {}
    for e in ext:
        if not e["error"]:
            series.setdefault(e["label"], []).append((e["seq_len"], e["accuracy"]))
    if series:
        png = accuracy_plot(series, args.results / "synthetic_induction.png", "test length",
                            f"induction heads trained at {scale.train_length} (dotted)", mark=scale.train_length)
        md += f"\n\n![induction heads against the test length]({png.name})"
    write_results("induction", {"runs": rows, "extrapolation": ext}, md, args.results)
    return failed


def do_mqar(args, scale: Scale) -> list[str]:
    out = args.out / TASK_DIRS["mqar"]
    cells = mqar_cells(scale, args.widths)
    failed = [] if args.report_only else run_grid(cells, cells, out, args.jobs)
    rows = [run_row("mqar", c, out) for c in cells]
    md = "## MQAR over (length, key-value pairs) (Zoology's Figure 2)\n\n" + mqar_markdown(rows, scale.mqar_cells)
    write_results("mqar", {"runs": rows}, md, args.results)
    return failed


COMMANDS = {"table1": do_table1, "induction": do_induction, "mqar": do_mqar, "lengths": do_lengths}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=[*COMMANDS, "all", "report"])
    parser.add_argument("tables", nargs="*", metavar="TABLE", help="report: only these tables (default: all four)")
    parser.add_argument("--out", type=Path, default=Path("runs/synthetic"), help="where the runs go")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the JSON, Markdown and plots go")
    parser.add_argument("--jobs", type=int, default=1, help="stages at once (one thread each)")
    parser.add_argument("--widths", default=None, help="MQAR widths, comma-separated (default 64; --tiny: 16)")
    parser.add_argument("--tiny", action="store_true", help="toy sizes: the whole script in seconds (its test)")
    args = parser.parse_args(argv)
    scale = TINY if args.tiny else CPU
    try:
        args.widths = [int(w) for w in args.widths.split(",")] if args.widths else list(scale.widths)
    except ValueError:
        parser.error(f"--widths: comma-separated integers, got {args.widths!r}")
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    args.report_only = args.command == "report"
    unknown = [t for t in args.tables if t not in COMMANDS]
    if unknown or (args.tables and args.command != "report"):
        parser.error(f"tables {unknown or args.tables}: name tables ({', '.join(COMMANDS)}) after `report` only")
    names = args.tables or (list(COMMANDS) if args.command in ("all", "report") else [args.command])
    failed: list[str] = []
    for name in names:
        failed += COMMANDS[name](args, scale)
    if failed:
        print(f"error: {len(failed)} stage(s) did not finish: {', '.join(failed)}; run the command again to resume",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # the guard that local worker processes need
    sys.exit(main())
