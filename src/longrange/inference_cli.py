"""Commands that use a finished run: predict, evaluate, extrapolate.

longrange predict RUN --input FILE [--output FILE]               one prediction per input, with its id
longrange evaluate RUN [--split test] [--task-option seq_len=N] [--json FILE]
longrange extrapolate RUN [RUN ...] --option seq_len --values 64,128,256 --out DIR
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from longrange.errors import ConfigError


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--task-option",
        "-o",
        action="append",
        metavar="KEY=VALUE",
        dest="task_options",
        help="a task option other than the run's, e.g. seq_len=4096 (repeatable)",
    )
    p.add_argument(
        "--weights", choices=("best", "last"), default="best", help="the run's best (default) or last weights"
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="sequences per batch (default: the run's evaluation batch, smaller where the memory budget needs)",
    )
    p.add_argument(
        "--memory-budget",
        metavar="SIZE",
        default=None,
        help="most memory evaluation may use, e.g. 8GiB (default $LONGRANGE_MEMORY_BUDGET, else 80%% of the "
        "free memory); a length whose one sequence needs more is refused",
    )
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: the GPU if there is one)")


def _load(args: argparse.Namespace, run_dir: str):
    from longrange.train.trained import load_run

    if args.batch_size is not None and args.batch_size < 1:
        raise ConfigError(f"--batch-size must be positive, got {args.batch_size}")
    return load_run(run_dir, which=args.weights, device=args.device)


def task_option_values(task: str, pairs: list[str] | None) -> dict[str, Any]:
    """``["seq_len=4096"]`` -> ``{"seq_len": 4096}``, typed like the task's defaults; a list of
    values (``seq_len=64,128``) is pointed to ``longrange extrapolate``."""
    from longrange.data import task_options
    from longrange.data.cli import parse_task_options

    defaults = task_options(task)
    for pair in pairs or []:
        key, _, raw = pair.partition("=")
        if "," in raw and not isinstance(defaults.get(key.strip()), str):
            raise ConfigError(
                f"task option {pair!r}: one value per option here; to evaluate at several values, run "
                f"`longrange extrapolate RUN --option {key.strip()} --values {raw}`"
            )
    return parse_task_options(task, pairs)


def _write_text(path: str, text: str) -> None:
    from pathlib import Path

    from longrange.fileio import atomic_write

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text.encode())


def _predict(args: argparse.Namespace) -> int:
    run = _load(args, args.run)
    options = task_option_values(run.task_name, args.task_options)
    records = run.read_inputs(args.input, options)
    predictions = run.predict(records, batch_size=args.batch_size, memory_budget=args.memory_budget)
    text = predictions_tsv(predictions)
    if args.output:
        _write_text(args.output, text)
    else:
        sys.stdout.write(text)
    note = f"{len(predictions)} predictions of {run.root} for {args.input}" + (
        f" written to {args.output}" if args.output else ""
    )
    print(note + labelled_note(predictions), file=sys.stderr)
    return 0


def predictions_tsv(predictions: list) -> str:
    """``longrange predict``'s output: a TSV with the header ``id<TAB>prediction``, a ``positions``
    column before the prediction where the task scores positions (per-position tasks: the answer at
    each of them, in order) and a ``target`` column where the inputs are labelled."""
    from longrange.train.trained import _text

    labelled = any(p.target is not None for p in predictions)
    at = any(p.positions is not None for p in predictions)
    header = "id" + ("\tpositions" if at else "") + "\tprediction" + ("\ttarget" if labelled else "")
    lines = [header]
    for p in predictions:
        line = p.id + (f"\t{_text(p.positions or [])}" if at else "") + f"\t{p.text()}"
        lines.append(line + (f"\t{_target_text(p.target)}" if labelled else ""))
    return "\n".join(lines) + "\n"


def labelled_note(predictions: list) -> str:
    """``; 3 of 4 labelled inputs right (75.00%)`` (answers, for per-position tasks), or '' without
    labels or for values that are not classes (regression)."""
    labelled = [p for p in predictions if p.target is not None]
    pairs = [pair for p in labelled for pair in p.answers()]
    if not pairs or any(isinstance(v, (float, list)) for v, _ in pairs):
        return ""
    right = sum(v == t for v, t in pairs)
    what = "answers" if any(p.positions is not None for p in labelled) else "inputs"
    return f"; {right} of {len(pairs)} labelled {what} right ({100 * right / len(pairs):.2f}%)"


def _target_text(target: Any) -> str:
    from longrange.train.trained import Prediction

    return "" if target is None else Prediction("", target).text()


def _evaluate(args: argparse.Namespace) -> int:
    run = _load(args, args.run)
    options = task_option_values(run.task_name, args.task_options)
    ev = run.evaluate(
        args.split, options, data_dir=args.data_dir, batch_size=args.batch_size, memory_budget=args.memory_budget
    )
    at = ", ".join(f"{k}={v}" for k, v in ev.changed.items()) or "the run's own task options"
    print(
        f"{ev.run}: {ev.task} {ev.split} split at {at}: {ev.items} items, batch {ev.batch_size} "
        f"({ev.memory}), {ev.device} {ev.precision}, {ev.seconds:.1f} s"
    )
    width = max(len(k) for k in ev.metrics)
    for key, value in ev.metrics.items():
        print(f"  {key:<{width}}  {value:.6g}" + ("   (selection metric)" if key == ev.metric else ""))
    if ev.summary is not None:
        print(
            f"the run's summary ({summary_agreement(ev.metrics, ev.summary)}): "
            + ", ".join(f"{k} {v:.6g}" for k, v in ev.summary.items() if isinstance(v, (int, float)))
        )
        if summary_agreement(ev.metrics, ev.summary) == "DIFFERENT":
            print(
                "warning: the metrics differ from the run's summary by more than rounding (other data, weights or "
                "precision)",
                file=sys.stderr,
            )
    if ev.same_data is False:
        print(
            f"warning: the data files of {ev.task} are not those the run was made with (their paths, sizes or "
            "modification times differ)",
            file=sys.stderr,
        )
    if args.json:
        from longrange.fileio import write_json

        write_json(args.json, ev.to_dict())
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def summary_agreement(metrics: dict, summary: dict, rel: float = 1e-5) -> str:
    """ "equal" when every metric the summary has is the same number; "equal up to rounding" within
    ``rel`` (other batches add the sums in another order); else "DIFFERENT"."""
    shared = [k for k in metrics if isinstance(summary.get(k), (int, float))]
    if all(metrics[k] == summary[k] for k in shared):
        return "equal"
    if all(abs(metrics[k] - summary[k]) <= rel * max(abs(summary[k]), 1e-12) for k in shared):
        return f"equal up to rounding, relative {rel:g}: other batches add in another order"
    return "DIFFERENT"


def parse_values(option: str, task: str, text: str) -> list[Any]:
    """``--values 64,128,256`` typed like the task's option ``option`` (errors name the value)."""
    items = [v.strip() for v in text.split(",") if v.strip()]
    if not items:
        raise ConfigError(f"--values: give comma-separated values of {option}, e.g. 64,128,256")
    return [task_option_values(task, [f"{option}={v}"])[option] for v in items]


def _extrapolate(args: argparse.Namespace) -> int:
    from longrange.report.extrapolation import option_sweep, sweep_table, write_sweep
    from longrange.report.tables import render_markdown

    runs = [_load(args, d) for d in args.runs]
    values = parse_values(args.option, runs[0].task_name, args.values)
    for run in runs[1:]:
        if parse_values(args.option, run.task_name, args.values) != values:
            raise ConfigError(f"--values {args.values} read differently for task {run.task_name} of {run.root}")
    fixed = task_option_values(runs[0].task_name, args.task_options)
    sweep = option_sweep(
        runs,
        args.option,
        values,
        split=args.split,
        fixed=fixed,
        metric=args.metric,
        data_dir=args.data_dir,
        batch_size=args.batch_size,
        memory_budget=args.memory_budget,
    )
    paths = write_sweep(sweep, args.out, plot=not args.no_plot)
    print(render_markdown(sweep_table(sweep)))
    print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="a finished run's predictions for new inputs in the task's file format")
    p.add_argument("run", metavar="RUN", help="the directory of a finished run")
    p.add_argument(
        "--input",
        required=True,
        metavar="FILE",
        help="new inputs in the task's format (docs/inference.md): ListOps a TSV with the header "
        "Source<TAB>Target, or Source alone; the generated sequence tasks JSON Lines "
        '{"id": ..., "tokens": [...]}; the pixel tasks PNG images',
    )
    p.add_argument("--output", metavar="FILE", help="write the predictions here (default: standard output)")
    _add_run_args(p)
    p.set_defaults(func=_predict)

    p = sub.add_parser("evaluate", help="a finished run's metrics on a split, at its own task options or at others")
    p.add_argument("run", metavar="RUN", help="the directory of a finished run")
    p.add_argument("--split", choices=("train", "val", "test"), default="test", help="the split (default test)")
    p.add_argument("--json", metavar="FILE", help="also write the evaluation as JSON")
    p.add_argument(
        "--data-dir", default=None, metavar="DIR", help="root data directory (default: where the run read its data)"
    )
    _add_run_args(p)
    p.set_defaults(func=_evaluate)

    p = sub.add_parser(
        "extrapolate",
        help="finished runs evaluated at several values of a task option (length extrapolation): a table and a plot",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="directories of finished runs (e.g. S6, S4D and attention)")
    p.add_argument("--option", default="seq_len", help="the task option to sweep (default seq_len)")
    p.add_argument("--values", required=True, help="comma-separated values, e.g. 64,128,256,512")
    p.add_argument("--split", choices=("train", "val", "test"), default="test", help="the split (default test)")
    p.add_argument("--metric", default=None, help="the metric to table and plot (default: each run's selection metric)")
    p.add_argument("--out", required=True, help="directory of extrapolation.{md,json,csv,png}")
    p.add_argument("--no-plot", action="store_true", help="write the tables only")
    p.add_argument(
        "--data-dir", default=None, metavar="DIR", help="root data directory (default: where each run read its data)"
    )
    _add_run_args(p)
    p.set_defaults(func=_extrapolate)
