"""The synthetic-task tables of the Mamba paper and Zoology at CPU scale (docs/synthetic-tasks.md).

Four tables, each from the CPU-scale presets (``mamba/selective-copying/cpu/*``,
``mamba/induction-heads/cpu/*``, ``zoology/mqar/cpu/*``; their budgets and the rule that fixed them
are in the presets' ``cpu/_base.yaml``):

* ``table1``: selective copying at length 256 for S4, S4D, DLR and S6 in the Simple ("no gate") and
  Mamba blocks, H3 (with its diagonal SSM, Table 1's "S4", and with S6) and Hyena in the H3
  architecture, Hyena in the Mamba block, and attention with absolute and rotary positions (the Mamba
  paper's Table 1);
* ``lengths``: selective copying with 16 data tokens at lengths 64 ... 1024 at the same budget, for
  S6, S4D and DLR in the Simple block and attention: where the models part (table and plot);
* ``induction``: induction heads trained at lengths 64 and 128 (seeds 0 and 1), the best weights
  evaluated at 2^6 ... 2^16 through ``longrange extrapolate``, for every model the toolkit has (the
  paper's Table 11, which trains at 256 and tests to 2^20; table and plot);
* ``mqar``: MQAR over Zoology's (length, key-value pairs) cells at width 64 (``--widths 64,128`` adds
  128) for attention, Mamba-S6 and time-invariant SSMs (Zoology's Figure 2); ``--models`` adds any
  other model of ``zoology/mqar/cpu/*`` (Hyena, H3, BaseConv, Based, RWKV, Mamba-2, GLA, DeltaNet,
  Gated DeltaNet), each long filter built for the cell's length.

    python benchmarks/synthetic_tables.py table1 --jobs 1
    python benchmarks/synthetic_tables.py lengths --jobs 1
    python benchmarks/synthetic_tables.py induction --jobs 1 [--models mamba-s6,h3]
    python benchmarks/synthetic_tables.py mqar --jobs 1 [--widths 64,128] [--models gla,mamba2]
    python benchmarks/synthetic_tables.py all --jobs 1       # the four, in this order
    python benchmarks/synthetic_tables.py report [TABLE...]  # the tables of what has finished

Every grid runs from scratch through the experiment layer (the plan, the scheduler and local worker
processes with one thread each), into ``runs/synthetic/<task>`` (``--out``); running a command again
reuses the finished runs, resumes interrupted ones and runs the rest; ``--models`` (table1,
induction, mqar) trains only the models named, so that a grid can be run in parts, and keeps the
other rows of the results file only where their recorded settings fingerprint is the current one
(the committed results, written before rows recorded it, are not kept: rerun them). ``table1`` and
``lengths`` share one grid (the length-256 runs of the lengths table are table1's). Every run has
seed 0 except the induction grid's, which has seeds 0 and 1. Each command then writes the
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longrange.report.plots import accuracy_against
from longrange.studies import tables
from longrange.studies.grid import SEED, GridRun, run_dir, run_fingerprint, run_grid
from longrange.studies.tables import minutes_text, percent_text, seeds_text

RESULTS = Path(__file__).resolve().parent / "results"
TASK_DIRS = {"copying": "selective-copying", "induction": "induction-heads", "mqar": "mqar"}

# ------------------------------------------------------------------------------------ the grids
TABLE1_MODELS = [
    "simple-s4",
    "simple-s4d",
    "simple-dlr",
    "simple-s6",
    "h3-s4",
    "hyena",
    "h3-s6",
    "mamba-s4",
    "mamba-s4d",
    "mamba-dlr",
    "mamba-hyena",
    "mamba-s6",
    "attention-abs",
    "attention-rope",
]
TABLE1_LENGTH = 256
LENGTH_MODELS = ["simple-s6", "simple-s4d", "simple-dlr", "attention-rope"]
LENGTHS = [64, 128, 256, 512, 1024]
#: Every model the toolkit has, each in the block its presets give it (mamba/induction-heads/cpu/*).
INDUCTION_MODELS = [
    "mamba-s6",
    "simple-s6",
    "mamba-s4d",
    "simple-s4d",
    "mamba-s4",
    "simple-s4",
    "mamba-dlr",
    "simple-dlr",
    "lru",
    "h3",
    "hyena",
    "mamba2",
    "mamba3",
    "gla",
    "deltanet",
    "gated-deltanet",
    "attention-abs",
    "attention-rope",
]
#: The training lengths (the paper's is 256, where no model learns at this budget: docs/synthetic-tasks.md).
TRAIN_LENGTHS = [64, 128]
INDUCTION_SEEDS = [0, 1]
EXTRAPOLATION_LENGTHS = [2**k for k in range(6, 17)]
#: Attention is evaluated up to 2^14, as in the paper: its time grows with the square of the length
#: (hours per sequence of 2^20 on one core), although its memory would reach 2^21 here.
ATTENTION_MAX_LENGTH = 2**14
#: Models whose layer is defined over at most ``l_max`` positions: set to the longest test length.
FIXED_SPAN_MODELS = ("hyena",)
#: Sequences evaluated at length L: 2^18 tokens, between 16 and 256 sequences.
EVAL_TOKENS, EVAL_MIN, EVAL_MAX = 2**18, 16, 256
MEMORY_BUDGET = "12GiB"
MQAR_MODELS = ["attention", "mamba-s6", "mamba-s4d", "simple-s4d", "simple-dlr"]
MQAR_CELLS = [(64, 4), (128, 8), (256, 16), (512, 64)]
MQAR_TOKENS = 4096  # tokens per step (batch = MQAR_TOKENS // length)

# The published figures (percent). Mamba paper Table 1 (architecture, layer); Table 11 (2^6 ... 2^20);
# Zoology Figure 2 at widths 64 and 128, read off the figure (assets/figure2.png) to about 0.03.
TABLE1_PAPER = {
    "simple-s4": 18.3,
    "simple-s6": 97.0,
    "h3-s4": 57.0,
    "hyena": 30.1,
    "h3-s6": 99.7,
    "mamba-s4": 56.4,
    "mamba-hyena": 28.4,
    "mamba-s6": 99.8,
}
#: Table 1's architecture (block) and layer columns where the preset's block or primitive is named otherwise:
#: the residual block with a GELU MLP is the H3 architecture, and H3's "S4" is the H3 layer's diagonal SSM.
TABLE1_BLOCKS = {"simple": "Simple (no gate)", "mamba": "Mamba", "transformer": "Transformer", "residual": "H3"}
TABLE1_LAYERS = {"h3-s4": "S4 (H3's S4D-Lin)", "h3-s6": "S6", "hyena": "Hyena", "mamba-hyena": "Hyena"}
TABLE11_PAPER = {  # as printed: ✓ perfect accuracy, ✗ out of memory
    "MHA-Abs (137K)": ["✓", "99.6", "100.0", "58.6", "26.6", "18.8", "9.8", "10.9", "7.8"] + ["✗"] * 6,
    "MHA-RoPE (137K)": ["✓", "✓", "100.0", "83.6", "31.3", "18.4", "8.6", "9.0", "5.5"] + ["✗"] * 6,
    "MHA-xPos (137K)": ["✓", "✓", "100.0", "99.6", "67.6", "25.4", "7.0", "9.0", "7.8"] + ["✗"] * 6,
    "H3 (153K)": [
        "✓",
        "✓",
        "100.0",
        "80.9",
        "39.5",
        "23.8",
        "14.8",
        "8.2",
        "5.9",
        "6.6",
        "8.2",
        "4.7",
        "8.2",
        "6.3",
        "7.4",
    ],
    "Hyena (69M)": [
        "97.7",
        "✓",
        "100.0",
        "✓",
        "44.1",
        "12.5",
        "6.6",
        "5.1",
        "7.0",
        "5.9",
        "6.6",
        "6.6",
        "5.9",
        "6.3",
        "9.8",
    ],
    "Mamba (74K)": ["✓", "✓", "100.0"] + ["✓"] * 12,
}
FIGURE2_PAPER = {  # width -> model -> accuracy at (64, 4), (128, 8), (256, 16), (512, 64)
    64: {
        "Attention": [1.0, 1.0, 1.0, 1.0],
        "Hyena": [0.51, 0.17, 0.04, 0.01],
        "RWKV": [0.76, 0.17, 0.04, 0.01],
        "H3": [0.92, 0.25, 0.06, 0.01],
        "BaseConv": [0.70, 0.37, 0.13, 0.01],
    },
    128: {
        "Attention": [1.0, 1.0, 1.0, 1.0],
        "Hyena": [0.75, 0.64, 0.13, 0.02],
        "RWKV": [0.93, 0.50, 0.05, 0.02],
        "H3": [0.99, 0.73, 0.64, 0.02],
        "BaseConv": [0.93, 0.62, 0.35, 0.02],
    },
}


@dataclass
class Scale:
    """The sizes a run of the script uses: the published CPU scale, or toy sizes (``--tiny``)."""

    table1_models: list[str]
    table1_length: int
    length_models: list[str]
    lengths: list[int]
    induction_models: list[str]
    train_lengths: list[int]
    induction_seeds: list[int]
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


CPU = Scale(
    TABLE1_MODELS,
    TABLE1_LENGTH,
    LENGTH_MODELS,
    LENGTHS,
    INDUCTION_MODELS,
    TRAIN_LENGTHS,
    INDUCTION_SEEDS,
    EXTRAPOLATION_LENGTHS,
    ATTENTION_MAX_LENGTH,
    EVAL_TOKENS,
    EVAL_MIN,
    EVAL_MAX,
    MQAR_MODELS,
    MQAR_CELLS,
    MQAR_TOKENS,
    [64],
)
_TOY = [
    "train.max_steps=2",
    "train.eval_every=0",
    "train.batch_size=4",
    "train.log_every=1",
    "model.d_model=16",
    "task.options.n_train=8",
    "task.options.n_val=4",
    "task.options.n_test=4",
]  # d_model: --widths for mqar
TINY = Scale(
    ["simple-s6", "h3-s4", "hyena", "attention-rope"],
    24,
    ["simple-s6", "attention-rope"],
    [16, 24],
    ["mamba-s6", "attention-abs"],
    [8, 16],
    [0, 1],
    [8, 16, 32, 64],
    32,
    64,
    2,
    4,
    ["attention", "mamba-s6"],
    [(16, 2), (32, 4)],
    64,
    [16],
    copying=_TOY + ["task.options.n_tokens=4"],
    induction=_TOY,
    mqar=_TOY + ["task.options.vocab_size=64"],
)


def _label(preset: str) -> str:
    from longrange.experiment.config import resolve

    return resolve(preset).label


def copying_cell(model: str, length: int, scale: Scale) -> GridRun:
    preset = f"mamba/selective-copying/cpu/{model}"
    over = [f"task.options.seq_len={length}", *scale.copying]
    if model.endswith(("-s4", "hyena")):  # S4's kernel and Hyena's filters are defined at the task's length
        over.append(f"model.primitive_options.l_max={length}")
    cell = GridRun(model, preset, f"{_label(preset)} L={length}", over, {"seq_len": length})
    options = cell.experiment().task.options
    cell.info.update(n_tokens=options["n_tokens"], vocab_size=options["vocab_size"])
    return cell


def copying_cells(scale: Scale, which: str) -> list[GridRun]:
    """table1: every model at the table's length; lengths: the length models at every length, the
    shortest first (attention at the longest last: the dearest run)."""
    if which == "table1":
        return [copying_cell(m, scale.table1_length, scale) for m in scale.table1_models]
    return [copying_cell(m, length, scale) for length in scale.lengths for m in scale.length_models]


def induction_cells(scale: Scale) -> list[GridRun]:
    """Every model at every training length and seed: the shorter length first, each model's seeds
    together. S4's kernel is defined at the training length; a layer defined over at most ``l_max``
    positions (Hyena's filter) gets the longest test length, so that it can be evaluated there."""
    cells = []
    for length in scale.train_lengths:
        for m in scale.induction_models:
            preset = f"mamba/induction-heads/cpu/{m}"
            over = [f"task.options.seq_len={length}", *scale.induction]
            if m.endswith("-s4"):
                over.append(f"model.primitive_options.l_max={length}")
            if m in FIXED_SPAN_MODELS:
                over.append(f"model.primitive_options.l_max={max(scale.extrapolation)}")
            label = f"{_label(preset)} L={length}"
            vocab = GridRun(m, preset, label, over, {}).experiment().task.options["vocab_size"]
            cells += [
                GridRun(m, preset, label, over, {"seq_len": length, "vocab_size": vocab}, seed)
                for seed in scale.induction_seeds
            ]
    return cells


def mqar_family() -> list[str]:
    """Every model of the MQAR presets (``zoology/mqar/cpu/*``): ``--models`` may add any of them."""
    from longrange.experiment.config import list_presets

    prefix = "zoology/mqar/cpu/"
    return [n[len(prefix) :] for n in list_presets() if n.startswith(prefix)]


def mqar_cells(scale: Scale, widths: list[int], extra: Sequence[str] = ()) -> list[GridRun]:
    """Every model (the scale's, then ``extra``) at every width and (length, pairs) cell; long filters
    (Hyena's, BaseConv's) built for the cell's length."""
    models = list(dict.fromkeys([*scale.mqar_models, *extra]))
    cells = []
    for width in widths:
        for length, pairs in scale.mqar_cells:
            for m in models:
                preset = f"zoology/mqar/cpu/{m}"
                over = [
                    f"task.options.seq_len={length}",
                    f"task.options.n_pairs={pairs}",
                    f"train.batch_size={max(1, scale.mqar_tokens // length)}",
                    *scale.mqar,
                    f"model.d_model={width}",
                ]
                if m == "attention":
                    over.append(f"model.max_len={length}")
                cells.append(
                    GridRun(
                        m,
                        preset,
                        f"{_label(preset)} L={length} d={width}",
                        over,
                        {"seq_len": length, "n_pairs": pairs, "d_model": width},
                        follow_length=True,
                    )
                )
    return cells


# ------------------------------------------------------------------------------ reading a grid
def run_row(table: str, cell: GridRun, out_dir: Path) -> dict[str, Any]:
    """A cell's settings and, once finished, its result (None fields while it is not)."""
    from longrange.report.collect import read_run
    from longrange.train.rundir import RunDir, RunState

    exp = cell.experiment()
    train = exp.train_config("train")
    path = run_dir(out_dir, cell)
    row = {
        "table": table,
        "model": cell.model,
        "label": _label(cell.preset),
        "preset": cell.preset,
        "overrides": cell.overrides,
        "seed": cell.seed,
        **cell.info,
        "block": exp.model.block,
        "primitive": exp.model.primitive,
        "d_model": exp.model.d_model,
        "lr": train.lr,
        "batch_size": train.batch_size,
        "max_steps": train.max_steps,
        "run": str(path),
        "fingerprint": run_fingerprint(cell),
        "state": RunDir(path).state().kind.value,
        "params": None,
        "steps": None,
        "seconds": None,
        "val_accuracy": None,
        "test_accuracy": None,
        "test_sequence_accuracy": None,
    }
    if RunDir(path).state().kind is RunState.FINISHED:
        r = read_run(path)
        test = r.test or {}
        row.update(
            params=r.params_total,
            steps=r.steps,
            seconds=round(r.seconds, 1),
            val_accuracy=r.best_val.get("accuracy"),
            test_accuracy=test.get("accuracy"),
            test_sequence_accuracy=test.get("sequence_accuracy"),
        )
    return row


# ----------------------------------------------------------------------------- extrapolation
def eval_count(length: int, scale: Scale) -> int:
    return max(scale.eval_min, min(scale.eval_max, scale.eval_tokens // length))


def is_attention(model: str) -> bool:
    return model.startswith("attention")


def evaluated(out_dir: Path) -> set[tuple[str, int]]:
    """(run, length) of every evaluation under ``out_dir/extrapolation``, the run as a resolved path
    (one that failed with a reason counts: it would fail again)."""
    done = set()
    for path in (out_dir / "extrapolation").glob("L*/extrapolation.json"):
        for run in json.loads(path.read_text())["runs"]:
            done.update((str(Path(run["run"]).resolve()), c["value"]) for c in run["cells"])
    return done


def extrapolation_groups(cells: list[GridRun], out_dir: Path, scale: Scale) -> list[tuple[list[int], int, list[str]]]:
    """(lengths, test sequences, runs) of each ``longrange extrapolate`` command: the finished runs
    (attention up to ``attention_max``) not yet evaluated at a length, at consecutive lengths that
    share the runs and the number of sequences."""
    groups: list[tuple[list[int], int, list[str]]] = []
    done = evaluated(out_dir)
    for length in scale.extrapolation:
        runs = [
            str(run_dir(out_dir, c))
            for c in cells
            if (run_dir(out_dir, c) / "summary.json").is_file()
            and not (is_attention(c.model) and length > scale.attention_max)
            and (str(run_dir(out_dir, c).resolve()), length) not in done
        ]
        n = eval_count(length, scale)
        if not runs:
            continue
        if groups and groups[-1][1:] == (n, runs):
            groups[-1][0].append(length)
        else:
            groups.append(([length], n, runs))
    return groups


def extrapolation_dir(out_dir: Path, lengths: list[int], part: int = 1) -> Path:
    """Where the evaluations at ``lengths`` go; ``part`` > 1: a later command at the same lengths
    (of runs finished since)."""
    return out_dir / "extrapolation" / ("L" + "-".join(str(n) for n in lengths) + ("" if part == 1 else f"-part{part}"))


def extrapolate(cells: list[GridRun], out_dir: Path, scale: Scale) -> list[str]:
    """``longrange extrapolate`` of the finished runs at every length they have not been evaluated at
    (however the output directory was named), one command per group of :func:`extrapolation_groups`,
    each into a folder of its own. Returns the groups whose command failed."""
    failed = []
    for lengths, n, runs in extrapolation_groups(cells, out_dir, scale):
        part = 1
        while (extrapolation_dir(out_dir, lengths, part) / "extrapolation.json").is_file():
            part += 1
        dest = extrapolation_dir(out_dir, lengths, part)
        values = ",".join(str(v) for v in lengths)
        cmd = [
            sys.executable,
            "-m",
            "longrange",
            "extrapolate",
            *runs,
            "--option",
            "seq_len",
            "--values",
            values,
            "--task-option",
            f"n_test={n}",
            "--memory-budget",
            MEMORY_BUDGET,
            "--out",
            str(dest),
            "--no-plot",
        ]
        print(f"== extrapolate at {values} ({n} sequences each): {len(runs)} runs", file=sys.stderr, flush=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)  # its progress on stderr, live
        print(proc.stdout, file=sys.stderr, flush=True)  # its table: ours is printed at the end
        if proc.returncode:
            failed.append(f"extrapolate at seq_len {values}")
    return failed


def extrapolation_rows(cells: list[GridRun], out_dir: Path, scale: Scale) -> list[dict[str, Any]]:
    """One row per run and length: the test accuracy, the sequences and seconds, or why none."""
    # matched however the output directory was named; each row names its run as the grid's rows do
    by_run = {str(run_dir(out_dir, c).resolve()): c for c in cells}
    named = {key: str(run_dir(out_dir, c)) for key, c in by_run.items()}
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
                rows.append(
                    {
                        "model": cell.model,
                        "label": _label(cell.preset),
                        "run": named[key],
                        "seed": cell.seed,
                        "trained_at": run["trained_at"],
                        "seq_len": c["value"],
                        "accuracy": (c.get("metrics") or {}).get("accuracy"),
                        "items": ev.get("items"),
                        "batch_size": ev.get("batch_size"),
                        "seconds": ev.get("seconds"),
                        "error": c.get("error"),
                    }
                )
    rows.sort(key=lambda r: (list(named.values()).index(r["run"]), r["seq_len"]))
    return rows


# ---------------------------------------------------------------------------------- tables
def table1_markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | block | layer | params | Table 1 | ours: test accuracy | val accuracy | steps | train min |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        block = TABLE1_BLOCKS[r["block"]]
        paper = TABLE1_PAPER.get(r["model"])
        layer = TABLE1_LAYERS.get(r["model"]) or (
            r["primitive"].upper() if r["primitive"] != "attention" else r["label"]
        )
        lines.append(
            f"| {r['label']}{' *' if r.get('earlier') else ''} | {block} | {layer} | {r['params'] or '—'} | {'—' if paper is None else paper} | "
            f"{percent_text(r['test_accuracy'])} | {percent_text(r['val_accuracy'])} | {r['steps'] or '—'} | {minutes_text(r['seconds'])} |"
        )
    lines.append("")
    if any(r.get("earlier") for r in rows):
        lines.append(
            "Rows marked * were not rerun by the command that wrote this table: they are the results of an "
            "earlier run of the same presets and settings, kept from the results file."
        )
        lines.append("")
    if rows:
        lines.append(
            f"Chance: {100 / (rows[0]['vocab_size'] - 2):.1f}% (the data tokens are uniform over "
            f"{rows[0]['vocab_size'] - 2})."
        )
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
            cells.append(
                "—"
                if r is None or r["test_accuracy"] is None
                else f"{percent_text(r['test_accuracy'])} ({minutes_text(r['seconds'])})"
            )
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def induction_groups(train_rows: list[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """The runs of each (model, training length), in the grid's order, each list in seed order."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in train_rows:
        groups.setdefault((r["label"], r["seq_len"]), []).append(r)
    return groups


def induction_markdown(
    train_rows: list[dict[str, Any]], ext_rows: list[dict[str, Any]], lengths: list[int], attention_max: int
) -> str:
    """Training (per model and training length) and test accuracy against the test length: the mean
    over seeds and, in parentheses, each seed's; the paper's Table 11 (trained at 256) below."""
    groups = induction_groups(train_rows)
    seeds = sorted({r["seed"] for r in train_rows})
    seed_names = ", ".join(str(s) for s in seeds)
    lines = [
        f"| model | trained at | params | lr | batch | steps | val accuracy: mean (seeds {seed_names}) | "
        "train min per run | evaluation min (all lengths and seeds) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (label, at), runs in groups.items():
        r = runs[0]
        spent = [e["seconds"] for e in ext_rows if e["run"] in {x["run"] for x in runs} and e["seconds"] is not None]
        secs = [x["seconds"] for x in runs if x["seconds"] is not None]
        star = " *" if any(x.get("earlier") for x in runs) else ""
        lines.append(
            f"| {label}{star} | {at} | {r['params'] or '—'} | {r['lr']:g} | {r['batch_size']} | "
            f"{r['steps'] or '—'} | {seeds_text([x['val_accuracy'] for x in runs])} | "
            f"{minutes_text(sum(secs) / len(secs)) if secs else '—'} | "
            f"{minutes_text(sum(spent)) if spent else '—'} |"
        )
    if any(r.get("earlier") for r in train_rows):
        lines += [
            "",
            "Rows marked * were not rerun by the command that wrote this table: they are the results of "
            "an earlier run of the same presets and settings, kept from the results file.",
        ]
    cell = {(r["run"], r["seq_len"]): r for r in ext_rows}
    notes: dict[str, int] = {}
    head = "| model | trained at | " + " | ".join(f"2^{int(math.log2(n))}" for n in lengths) + " |"
    answers = train_rows[0]["vocab_size"] - 1 if train_rows else 0  # the data tokens: the trigger is never the answer
    chance = f" Chance: {100 / answers:.1f}% ({answers} possible answers)." if train_rows else ""
    lines += [
        "",
        f"Test accuracy (%) against the test length: the mean over seeds {seed_names}, each seed's in "
        f"parentheses; * the training length; (n) see the notes.{chance}",
        "",
        head,
        "|---|---:|" + "---:|" * len(lengths),
    ]
    for (label, at), runs in groups.items():
        cells = []
        for n in lengths:
            evs = [cell.get((r["run"], n)) for r in runs]
            errors = [e["error"] for e in evs if e is not None and e["error"]]
            if all(e is None for e in evs):
                cells.append("not run" if is_attention(runs[0]["model"]) and n > attention_max else "—")
            elif errors:
                cells.append(f"— ({notes.setdefault(errors[0], len(notes) + 1)})")
            else:
                cells.append(seeds_text([None if e is None else e["accuracy"] for e in evs], star=n == at))
        lines.append(f"| {label} | {at} | " + " | ".join(cells) + " |")
    published = [2**k for k in range(6, 21)]
    if set(lengths) <= set(published):
        for name, values in TABLE11_PAPER.items():
            shown = [str(values[published.index(n)]) for n in lengths]
            lines.append(f"| paper: {name} | 256 | " + " | ".join(shown) + " |")
    counts = {n: next((e["items"] for e in ext_rows if e["seq_len"] == n and e["items"]), None) for n in lengths}
    lines += [
        "",
        "Sequences evaluated per length: "
        + ", ".join(f"2^{int(math.log2(n))}: {c}" for n, c in counts.items() if c)
        + ".",
    ]
    if set(lengths) <= set(published):
        lines.append(
            "The paper's rows (Table 11) are trained at 256, ours at the length of their row; ✓ is the "
            "paper's mark for perfect accuracy, ✗ out of memory."
        )
    lines += [f"({k}) {reason}" for reason, k in notes.items()]
    return "\n".join(lines)


def mqar_markdown(rows: list[dict[str, Any]], cells: list[tuple[int, int]]) -> str:
    head = "| model | width | " + " | ".join(f"({n}, {p})" for n, p in cells) + " |"
    lines = [
        "Test accuracy (%) at (length, key-value pairs); training minutes in parentheses.",
        "",
        head,
        "|---|---:|" + "---:|" * len(cells),
    ]
    by = {(r["label"], r["d_model"], r["seq_len"]): r for r in rows}
    for label, width in dict.fromkeys((r["label"], r["d_model"]) for r in rows):
        out = []
        for n, _ in cells:
            r = by.get((label, width, n))
            out.append(
                "—"
                if r is None or r["test_accuracy"] is None
                else f"{percent_text(r['test_accuracy'])} ({minutes_text(r['seconds'])}){' *' if r.get('earlier') else ''}"
            )
        lines.append(f"| {label} | {width} | " + " | ".join(out) + " |")
    if [c for c in cells] == MQAR_CELLS:
        for width, models in FIGURE2_PAPER.items():
            for name, values in models.items():
                lines.append(f"| Zoology: {name} | {width} | " + " | ".join(f"≈{100 * v:.0f}" for v in values) + " |")
    if any(r.get("earlier") for r in rows):
        lines += [
            "",
            "Cells marked * were not rerun by this command (--models): each is the finished run of an earlier "
            "run of the same preset and settings, kept from the results file.",
        ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------- the commands
def write_results(name: str, data: dict[str, Any], markdown: str, results: Path) -> None:
    raw, _ = tables.write_results(results, f"synthetic_{name}", data, markdown)
    print(markdown)
    print(f"wrote {raw} and .md", file=sys.stderr)


def copying_grid(scale: Scale) -> list[GridRun]:
    grid = copying_cells(scale, "table1")
    labels = {c.label for c in grid}
    return grid + [c for c in copying_cells(scale, "lengths") if c.label not in labels]


def earlier_row(row: dict[str, Any], results: Path) -> dict[str, Any]:
    """``row`` (of a run that is not finished under ``--out``), or the finished row of the same model
    with the same preset, overrides and settings (its stage's fingerprint: a preset changed since is
    not the same run) in the results file an earlier run of this script wrote (marked ``earlier``):
    ``--models`` reruns some rows and keeps the others as measured. A row written without a
    fingerprint is never kept."""
    path = results / f"synthetic_{row['table']}.json"
    if row["test_accuracy"] is not None or not path.is_file():
        return row
    for old in json.loads(path.read_text()).get("runs", []):
        same = all(old.get(k) == row[k] for k in ("model", "preset", "overrides", "fingerprint"))
        if same and old.get("seed", SEED) == row.get("seed", SEED) and old.get("test_accuracy") is not None:
            return {**old, "earlier": True}
    return row


def do_table1(args, scale: Scale) -> list[str]:
    out = args.out / TASK_DIRS["copying"]
    cells = copying_cells(scale, "table1")
    chosen = [c for c in cells if not args.models or c.model in args.models]
    failed = [] if args.report_only else run_grid(chosen, copying_grid(scale), out, args.jobs)
    rows = [earlier_row(run_row("table1", c, out), args.results) for c in cells]
    md = f"## Selective copying at length {scale.table1_length} (the Mamba paper's Table 1)\n\n" + table1_markdown(rows)
    write_results("table1", {"runs": rows}, md, args.results)
    return failed


def do_lengths(args, scale: Scale) -> list[str]:
    out = args.out / TASK_DIRS["copying"]
    cells = copying_cells(scale, "lengths")
    failed = [] if args.report_only else run_grid(cells, copying_grid(scale), out, args.jobs)
    rows = [run_row("lengths", c, out) for c in cells]
    tokens = rows[0]["n_tokens"] if rows else "?"
    md = f"## Selective copying against length ({tokens} data tokens, the same budget)\n\n" + lengths_markdown(
        rows, scale.lengths
    )
    series: dict[str, list] = {}
    for r in rows:
        series.setdefault(r["label"], []).append((r["seq_len"], r["test_accuracy"]))
    if any(y is not None for pts in series.values() for _, y in pts):
        png = accuracy_against(
            series,
            args.results / "synthetic_lengths.png",
            "sequence length (16 data tokens)",
            "selective copying at a fixed budget",
        )
        md += f"\n\n![selective copying against length]({png.name})"
    write_results("lengths", {"runs": rows}, md, args.results)
    return failed


def earlier_extrapolation(rows: list[dict[str, Any]], ext: list[dict[str, Any]], results: Path) -> list[dict[str, Any]]:
    """The evaluations of the rows kept from the results file (:func:`earlier_row`), from the same file."""
    runs = {r["run"] for r in rows if r.get("earlier")} - {e["run"] for e in ext}
    path = results / "synthetic_induction.json"
    if not runs or not path.is_file():
        return []
    return [e for e in json.loads(path.read_text()).get("extrapolation", []) if e["run"] in runs]


def do_induction(args, scale: Scale) -> list[str]:
    out = args.out / TASK_DIRS["induction"]
    cells = induction_cells(scale)
    chosen = [c for c in cells if not args.models or c.model in args.models]
    failed = [] if args.report_only else run_grid(chosen, cells, out, args.jobs)
    if not args.report_only:
        failed += extrapolate(cells, out, scale)
    rows = [earlier_row(run_row("induction", c, out), args.results) for c in cells]
    ext = extrapolation_rows(cells, out, scale)
    ext += earlier_extrapolation(rows, ext, args.results)
    at = ", ".join(str(n) for n in scale.train_lengths)
    seeds = ", ".join(str(s) for s in scale.induction_seeds)
    md = (
        f"## Induction heads trained at {at} (seeds {seeds}), tested at other lengths "
        "(the Mamba paper's Table 11)\n\n" + induction_markdown(rows, ext, scale.extrapolation, scale.attention_max)
    )
    plotted = scale.train_lengths[0]
    runs = {r["run"]: r for r in rows if r["seq_len"] == plotted}
    by: dict[str, dict[int, list[float]]] = {}
    for e in ext:
        if e["run"] in runs and not e["error"] and e["accuracy"] is not None:
            by.setdefault(e["label"], {}).setdefault(e["seq_len"], []).append(e["accuracy"])
    series = {label: [(n, sum(v) / len(v)) for n, v in sorted(pts.items())] for label, pts in by.items()}
    if series:
        chance = 1 / (rows[0]["vocab_size"] - 1)
        png = accuracy_against(
            series,
            args.results / "synthetic_induction.png",
            "test length",
            f"induction heads trained at {plotted} (dotted), mean over seeds {seeds}",
            mark=plotted,
            chance=chance,
        )
        md += f"\n\n![induction heads against the test length]({png.name})"
    write_results("induction", {"runs": rows, "extrapolation": ext}, md, args.results)
    return failed


def do_mqar(args, scale: Scale) -> list[str]:
    out = args.out / TASK_DIRS["mqar"]
    family = set(mqar_family())
    cells = mqar_cells(scale, args.widths, [m for m in args.models if m in family])
    chosen = [c for c in cells if not args.models or c.model in args.models]
    failed = [] if args.report_only else run_grid(chosen, cells, out, args.jobs)
    rows = [earlier_row(run_row("mqar", c, out), args.results) for c in cells]
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
    parser.add_argument(
        "--models",
        default=None,
        help="table1, induction, mqar: train only these models (comma-separated; mqar: any of "
        "zoology/mqar/cpu/*, added to its table); the table keeps the other rows from the results file "
        "where an earlier run finished them with the same settings",
    )
    args = parser.parse_args(argv)
    scale = TINY if args.tiny else CPU
    try:
        args.widths = [int(w) for w in args.widths.split(",")] if args.widths else list(scale.widths)
    except ValueError:
        parser.error(f"--widths: comma-separated integers, got {args.widths!r}")
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    args.models = [m.strip() for m in args.models.split(",")] if args.models else []
    grids = {"table1": scale.table1_models, "induction": scale.induction_models, "mqar": mqar_family()}
    if args.models and args.command not in (*grids, "all"):
        parser.error(f"--models: only with table1, induction, mqar or all, not {args.command}")
    for name, models in grids.items():
        unknown_models = [m for m in args.models if m not in models]
        if args.command == name and unknown_models:
            parser.error(f"--models: {', '.join(unknown_models)} not in {name}'s models ({', '.join(models)})")
    unknown_models = [m for m in args.models if not any(m in models for models in grids.values())]
    if args.command == "all" and unknown_models:
        parser.error(f"--models: {', '.join(unknown_models)} not in table1's, induction's or mqar's models")
    args.report_only = args.command == "report"
    unknown = [t for t in args.tables if t not in COMMANDS]
    if unknown or (args.tables and args.command != "report"):
        parser.error(f"tables {unknown or args.tables}: name tables ({', '.join(COMMANDS)}) after `report` only")
    names = args.tables or (list(COMMANDS) if args.command in ("all", "report") else [args.command])
    failed: list[str] = []
    try:
        for name in names:
            failed += COMMANDS[name](args, scale)
    except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM: the running stages have written checkpoints
        print(f"interrupted ({err or 'Ctrl-C'}): run the same command again to resume", file=sys.stderr)
        return 130
    if failed:
        print(
            f"error: {len(failed)} stage(s) did not finish: {', '.join(failed)}; run the command again to resume",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":  # the guard that local worker processes need
    sys.exit(main())
