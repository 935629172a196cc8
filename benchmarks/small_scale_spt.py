"""Where does self-pretraining pay at small scale? The study behind docs/small-scale-spt.md.

Every setting is a small comparison (scratch, masked SPT -> finetune, compute-matched scratch) over
at least three seeds on generated data. The rules of the study are built in:

* ``screen`` runs settings and prints, per setting and model, the paired SPT-minus-scratch difference
  of the VALIDATION metric (mean and 95% CI over seeds). Settings are chosen on this table only.
* ``test SETTING...`` prints the test-split verdict of the chosen settings, once.
* ``table`` prints every setting tried so far (validation split only) in
  Markdown, for the study document.

    python benchmarks/small_scale_spt.py settings                   # what each setting is (Markdown)
    python benchmarks/small_scale_spt.py screen --jobs 2            # all settings (skips finished runs)
    python benchmarks/small_scale_spt.py screen listops-short-s4d-10pct --seeds 0,1,2,3,4 --jobs 2
    python benchmarks/small_scale_spt.py table > /tmp/table.md
    python benchmarks/small_scale_spt.py test listops-short-dlr-random-10pct   # once, when chosen

Runs go to ``runs/study/<setting>`` (``--out``); generated data to ``runs/study/data``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

#: Generated data sets (name -> generator and options).
DATASETS: dict[str, dict[str, Any]] = {
    "listops-short": {
        "kind": "listops",
        "n_train": 8000,
        "n_val": 500,
        "n_test": 1000,
        "min_length": 32,
        "max_length": 128,
        "max_depth": 4,
        "max_args": 5,
    },
    # LRA's generator defaults (depth and arguments up to 10) in a shorter window: shallower trees
    # (depth 6, 6 arguments) almost never reach 250 tokens.
    "listops-500": {
        "kind": "listops",
        "n_train": 4000,
        "n_val": 500,
        "n_test": 1000,
        "min_length": 250,
        "max_length": 500,
        "max_depth": 10,
        "max_args": 10,
    },
    "pathfinder-16": {"kind": "pathfinder", "resolution": 16, "n_samples": 6000, "contour_length": 6},
}

_MODELS: dict[str, dict[str, Any]] = {
    "s4d": {
        "label": "S4D",
        "model": {
            "block": "simple",
            "primitive": "s4d",
            "direction": "bidirectional",
            "n_layers": 2,
            "d_model": 64,
            "d_state": 32,
        },
    },
    "dlr-random": {
        "label": "DLR (random)",
        "model": {
            "block": "simple",
            "primitive": "dlr",
            "direction": "bidirectional",
            "n_layers": 2,
            "d_model": 64,
            "d_state": 64,
            "primitive_options": {"init": "random"},
        },
    },
    "dlr-structured": {
        "label": "DLR (structured)",
        "model": {
            "block": "simple",
            "primitive": "dlr",
            "direction": "bidirectional",
            "n_layers": 2,
            "d_model": 64,
            "d_state": 64,
            "primitive_options": {"init": "structured"},
        },
    },
    "transformer": {
        "label": "Transformer",
        "model": {
            "block": "transformer",
            "primitive": "attention",
            "direction": "bidirectional",
            "n_layers": 2,
            "d_model": 64,
            "n_heads": 4,
            "rope": True,
        },
    },
}


def _setting(
    data: str,
    model: str,
    *,
    subset: float | None = None,
    epochs: int = 8,
    pre_epochs: int = 8,
    mask_ratio: float | None = None,
    lr: float = 0.002,
    batch: int = 32,
) -> dict[str, Any]:
    d = DATASETS[data]
    task = (
        {"name": "listops", "options": {"seq_len": d["max_length"]}}
        if d["kind"] == "listops"
        else {"name": "pathfinder", "options": {"resolution": d["resolution"], "difficulty": d["contour_length"]}}
    )
    if subset is not None:
        task["train_subset"] = subset
    return {
        "data": data,
        "experiment": {
            "label": _MODELS[model]["label"],
            "task": task,
            "model": {**_MODELS[model]["model"], "dropout": 0.0},
            "train": {
                "lr": lr,
                "weight_decay": 0.01,
                "batch_size": batch,
                "epochs": epochs,
                "warmup": 0.1,
                "schedule": "cosine",
                "grad_clip": 1.0,
                "log_every": 20,
                "progress": False,
            },
            "pretrain": {"epochs": pre_epochs},
            "objective": {"mask_ratio": mask_ratio} if mask_ratio is not None else {},
            "compare": {"objectives": ["masked"], "compute_matched": True},
        },
    }


#: Every setting of the study, in the order they were tried. Never remove one that was run.
#: Data-scarce settings first: both papers find the gains of SPT largest when labelled data is scarce.
SETTINGS: dict[str, dict[str, Any]] = {
    "listops-short-s4d-10pct": _setting("listops-short", "s4d", subset=0.1, epochs=30, pre_epochs=30),
    "listops-short-transformer-10pct": _setting("listops-short", "transformer", subset=0.1, epochs=30, pre_epochs=30),
    "listops-short-dlr-random-10pct": _setting("listops-short", "dlr-random", subset=0.1, epochs=30, pre_epochs=30),
    "pathfinder-16-s4d-1000": _setting("pathfinder-16", "s4d", subset=1000, epochs=20, pre_epochs=20),
    "listops-short-dlr-structured-10pct": _setting(
        "listops-short", "dlr-structured", subset=0.1, epochs=30, pre_epochs=30
    ),
    "listops-short-dlr-random-30pct": _setting("listops-short", "dlr-random", subset=0.3, epochs=12, pre_epochs=12),
    "listops-short-dlr-random": _setting("listops-short", "dlr-random"),
    "listops-short-s4d": _setting("listops-short", "s4d"),
    "listops-500-dlr-random-500": _setting("listops-500", "dlr-random", subset=500, epochs=30, pre_epochs=30),
}

SEEDS = [0, 1, 2]


def prepare_data(name: str, data_root: Path) -> None:
    spec = dict(DATASETS[name])
    kind = spec.pop("kind")
    root = data_root / name
    if kind == "listops":
        from longrange.data.generate.listops import generate

        if not (root / "listops" / "basic_test.tsv").is_file():
            generate(root / "listops", seed=0, quiet=True, **spec)
    else:
        from longrange.data.generate.pathfinder import generate

        if not (root / "pathfinder").is_dir():
            generate(root / "pathfinder", seed=0, quiet=True, **spec)


def screen(names: list[str], out: Path, jobs: int, seeds: list[int]) -> None:
    from longrange.experiment.backends import LocalWorkers
    from longrange.experiment.compare import compare
    from longrange.experiment.config import experiment_from_dict

    # One thread per stage, also with one job: runs are then bitwise the same whatever --jobs is.
    executor = LocalWorkers(jobs=jobs, threads_per_job=1)
    for name in names:
        setting = SETTINGS[name]
        prepare_data(setting["data"], out / "data")
        exp = experiment_from_dict(
            {
                **setting["experiment"],
                "task": {**setting["experiment"]["task"], "data_dir": str(out / "data" / setting["data"])},
            }
        )
        start = time.time()
        print(f"== {name}", file=sys.stderr, flush=True)
        compare([exp], out / name, seeds=seeds, executor=executor)
        print(f"== {name}: {(time.time() - start) / 60:.1f} min", file=sys.stderr, flush=True)
        print(rows_markdown([name], out, split="val"))


def _paired(out: Path, name: str, split: str) -> list[dict[str, Any]]:
    """Per regime against scratch: paired differences of the chosen split's metric over seeds."""
    from longrange.studies.tables import paired_rows, study_rows

    return paired_rows(study_rows(out, [name]), split)


def rows_markdown(names: list[str], out: Path, split: str) -> str:
    lines = [
        f"| setting | model | regime vs scratch | n | scratch ({split}) | other ({split}) | difference, 95% CI |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for name in names:
        if not (out / name).is_dir():
            continue
        for row in _paired(out, name, split):
            mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
            ci = f"[{row['low']:+.1f}, {row['high']:+.1f}]" if row["low"] is not None else "n < 2"
            lines.append(
                f"| {name} | {row['label']} | {row['regime']} | {row['n']} | {mean(row['scratch']):.1f} | "
                f"{mean(row['spt']):.1f} | {row['mean']:+.1f} {ci} |"
            )
    return "\n".join(lines)


def settings_markdown(names: list[str]) -> str:
    """One row per setting: its data, model, training subset and epochs (for the study document)."""
    lines = [
        "| setting | data | model | training examples | epochs: pretrain / finetune, scratch | mask ratio |",
        "|---|---|---|---:|---|---:|",
    ]
    for name in names:
        setting = SETTINGS[name]
        d, exp = DATASETS[setting["data"]], setting["experiment"]
        if d["kind"] == "listops":
            data = (
                f"ListOps, lengths {d['min_length']}-{d['max_length']}, depth <= {d['max_depth']}, "
                f"<= {d['max_args']} args; {d['n_train']}/{d['n_val']}/{d['n_test']}"
            )
        else:
            data = (
                f"Pathfinder {d['resolution']}x{d['resolution']}, contour length {d['contour_length']}; "
                f"{d['n_samples']} images split 80/10/10"
            )
        m = exp["model"]
        model = f"{exp['label']}: {m['n_layers']} layers, d_model {m['d_model']}" + (
            f", d_state {m['d_state']}" if "d_state" in m else ""
        )
        n_train = d["n_train"] if d["kind"] == "listops" else int(0.8 * d["n_samples"])
        subset = exp["task"].get("train_subset")
        subset = (
            f"all {n_train}"
            if subset is None
            else f"{subset:.0%} = {max(1, round(subset * n_train))}"
            if isinstance(subset, float)
            else f"{subset} of {n_train}"
        )
        ratio = exp["objective"].get("mask_ratio") or ("0.1" if d["kind"] == "listops" else "0.5")
        lines.append(
            f"| {name} | {data} | {model} | {subset} | {exp['pretrain']['epochs']} / {exp['train']['epochs']} "
            f"| {ratio} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("screen", "test", "table", "list", "settings"))
    parser.add_argument("settings", nargs="*")
    parser.add_argument("--out", type=Path, default=Path("runs/study"))
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument(
        "--seeds",
        default=",".join(map(str, SEEDS)),
        help="screen: comma-separated seeds (default %(default)s; more seeds add to the finished ones)",
    )
    args = parser.parse_args(argv)
    unknown = [s for s in args.settings if s not in SETTINGS]
    if unknown:
        parser.error(f"unknown setting(s) {unknown}; known: {', '.join(SETTINGS)}")
    names = args.settings or list(SETTINGS)
    if args.action == "list":
        print(json.dumps(SETTINGS, indent=1))
    elif args.action == "settings":
        print(settings_markdown(names))
    elif args.action == "screen":
        screen(names, args.out, args.jobs, [int(s) for s in args.seeds.split(",")])
    elif args.action == "test":
        if not args.settings:
            parser.error("name the settings chosen on the validation split")
        print(rows_markdown(names, args.out, split="test"))
    else:
        print(rows_markdown(names, args.out, split="val"))
    return 0


if __name__ == "__main__":  # the guard that local worker processes need
    sys.exit(main())
