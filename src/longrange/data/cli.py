"""``longrange data``: list tasks, check and prepare their files, generate synthetic sets.

    longrange data list
    longrange data info listops [--data-dir D] [-o seq_len=1024]
    longrange data prepare text [--data-dir D] [-o min_count=15] [--skip-bad]
    longrange data generate listops --out data/listops [--n-train 96000 ...]
    longrange data generate pathfinder --out data/pathfinder [--resolution 32 ...]

Task options (``-o KEY=VALUE``, repeatable) take the type of the option's default value.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import time

from longrange import smoke
from longrange.errors import ConfigError
from longrange.registry import unknown_option

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_task_options(task: str, pairs: list[str] | None) -> dict:
    """``["seq_len=1024", ...]`` -> ``{"seq_len": 1024}``, typed like the task's defaults."""
    from longrange.data import task_options

    defaults = task_options(task)
    out: dict = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"task option {pair!r} must look like KEY=VALUE")
        if key not in defaults:
            raise unknown_option(key, f"task {task}", list(defaults))
        default = defaults[key]
        try:
            if isinstance(default, bool):
                if raw.lower() not in _TRUE | _FALSE:
                    raise ValueError
                value: object = raw.lower() in _TRUE
            elif isinstance(default, int):
                value = int(raw)
            elif isinstance(default, float):
                value = float(raw)
            elif default is None:
                value = raw
            else:
                value = type(default)(raw)
        except ValueError:
            kind = {bool: "a boolean (true/false)", int: "an integer", float: "a number"}.get(type(default), "a string")
            raise ConfigError(f"task option {key}: expected {kind}, got {raw!r}") from None
        out[key] = value
    return out


def _add_task_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task", help="task name (see `longrange data list`)")
    parser.add_argument("--data-dir", default=None, help="root data directory (default $LONGRANGE_DATA or ./data)")
    parser.add_argument(
        "-o",
        "--option",
        action="append",
        metavar="KEY=VALUE",
        dest="options",
        help="a task option, e.g. -o seq_len=1024 (repeatable)",
    )


def cmd_list(args: argparse.Namespace) -> int:
    from longrange.data import get_spec, list_tasks

    rows = [("task", "kind", "length", "classes", "metric", "mask ratio")]
    for name in list_tasks():
        spec = get_spec(name)
        kind = spec.input_kind + (" x2" if spec.two_sequences else "")
        if spec.input_kind == "numeric" and spec.d_input > 1:
            kind += f" ({spec.d_input} ch)"
        classes = str(spec.n_classes) if spec.n_classes else f"regr. ({spec.n_targets})"
        if spec.per_position:
            classes += " per answer" + (", causal" if spec.causal else "")
        rows.append((name, kind, str(spec.seq_len), classes, spec.metric, f"{spec.mask_ratio:g}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from longrange.data.generated import generator
    from longrange.data.registry import get_spec, task_options
    from longrange.data.state import data_state

    options = parse_task_options(args.task, args.options)
    spec = get_spec(args.task, **options)
    state = data_state(args.task, args.data_dir, **options)
    present, lines = state.present, state.file_lines()
    resolved = {**task_options(args.task), **options}
    print(f"{spec.name}: {spec.description}")
    print(
        f"  inputs:      {spec.input_kind}{' (two sequences)' if spec.two_sequences else ''}, length {spec.seq_len}"
        + (f", {spec.d_input} channels" if spec.input_kind == "numeric" else "")
    )
    if spec.per_position:
        print(
            f"  target:      {spec.n_classes} classes at each position that asks an answer, metric {spec.metric} "
            "over answers (and sequence_accuracy over whole sequences)"
            + ("; next-token answers: models must be causal" if spec.causal else "")
        )
    elif spec.n_classes:
        print(f"  target:      {spec.n_classes} classes, metric {spec.metric}")
    else:
        print(f"  target:      {spec.n_targets} regression value(s), metric {spec.metric}")
    print(f"  mask ratio:  {spec.mask_ratio:g} (default for masked self-pretraining)")
    if resolved:
        print("  options:     " + ", ".join(f"{k}={v}" for k, v in sorted(resolved.items())))
    print(f"  layout:      {spec.layout}")
    print(f"  data dir:    {state.data_dir}")
    print(f"  status:      {'present' if present else 'MISSING'}")
    for line in lines:
        print(f"    {line}")
    if not present:
        print(f"  to obtain:   {spec.obtain}")
    gen = generator(args.task)
    if gen is not None:
        print(
            "  generated:   built on first use with task.generate=NAME (or a mapping of these options); configurations:"
        )
        for name, values in gen.configurations.items():
            shown = ", ".join(f"{k}={v}" for k, v in {**gen.defaults, **values}.items())
            print(f"    {name}: {shown}")
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    from longrange.data import load_task

    options = parse_task_options(args.task, args.options)
    start = time.perf_counter()
    data = load_task(args.task, args.data_dir, skip_bad=args.skip_bad, **options)
    sizes = ", ".join(f"{split} {len(getattr(data, split))}" for split in ("train", "val", "test"))
    vocab = f", vocabulary {data.vocab_size}" if data.vocab is not None else ""
    print(f"{args.task}: {sizes}{vocab} ({time.perf_counter() - start:.1f}s)")
    return 0


def _check_out(out: str) -> None:
    """A file in the way of ``--out`` is a one-line ConfigError before anything is generated."""
    from longrange.fileio import check_out_dir

    check_out_dir(out)


def cmd_generate_listops(args: argparse.Namespace) -> int:
    from longrange.data.generate.listops import generate

    _check_out(args.out)
    sizes = smoke.generated_sizes({"n_train": args.n_train, "n_val": args.n_val, "n_test": args.n_test})
    args.n_train, args.n_val, args.n_test = sizes["n_train"], sizes["n_val"], sizes["n_test"]
    start = time.perf_counter()
    paths = generate(
        args.out,
        n_train=args.n_train,
        n_val=args.n_val,
        n_test=args.n_test,
        min_length=args.min_length,
        max_length=args.max_length,
        max_depth=args.max_depth,
        max_args=args.max_args,
        seed=args.seed,
        quiet=args.quiet,
    )
    for split, path in paths.items():
        print(f"{split}: {path}")
    print(f"listops: {args.n_train + args.n_val + args.n_test} samples in {time.perf_counter() - start:.1f}s")
    return 0


def _register_generate_listops(sub: argparse._SubParsersAction) -> None:
    from longrange.data.generate.listops import DEFAULTS

    p = sub.add_parser(
        "listops",
        help="the LRA ListOps generator (writes basic_{train,val,test}.tsv)",
        description="Generate ListOps in the LRA format. Defaults are LRA's; a small quick set: "
        "--n-train 2000 --n-val 200 --n-test 200 --min-length 50 --max-length 256.",
    )
    p.add_argument("--out", required=True, help="output directory (e.g. data/listops)")
    for name in ("n_train", "n_val", "n_test", "min_length", "max_length", "max_depth", "max_args", "seed"):
        p.add_argument(
            "--" + name.replace("_", "-"), type=int, default=DEFAULTS[name], help=f"default {DEFAULTS[name]}"
        )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_generate_listops)


_PATHFINDER_MAIN = (
    "resolution",
    "n_samples",
    "contour_length",
    "n_distractors",
    "distractor_length",
    "samples_per_dir",
    "seed",
)


def cmd_generate_pathfinder(args: argparse.Namespace) -> int:
    from longrange.data.generate.pathfinder import generate

    _check_out(args.out)
    kwargs = {name: getattr(args, name) for name in _PATHFINDER_MAIN if getattr(args, name) is not None}
    geometry = {name: value for name, value in vars(args).items() if name.startswith("geometry_") and value is not None}
    kwargs.update({name[len("geometry_") :]: value for name, value in geometry.items()})
    if smoke.active():  # LONGRANGE_SMOKE=1: fewer images
        from longrange.data.generate.pathfinder import GENERATE_DEFAULTS

        kwargs = smoke.generated_sizes({"n_samples": GENERATE_DEFAULTS["n_samples"], **kwargs})
    start = time.perf_counter()
    root = generate(args.out, quiet=args.quiet, **kwargs)
    print(f"pathfinder: written to {root} in {time.perf_counter() - start:.1f}s")
    return 0


def _register_generate_pathfinder(sub: argparse._SubParsersAction) -> None:
    import inspect

    from longrange.data.generate import pathfinder

    params = inspect.signature(pathfinder.generate).parameters
    p = sub.add_parser(
        "pathfinder",
        help="a Pathfinder generator writing the LRA layout",
        description="Generate Pathfinder images and metadata in the LRA layout "
        "(<out>/pathfinder<R>/curv_contour_length_<C>/...).",
    )
    p.add_argument("--out", required=True, help="output root (e.g. data/pathfinder)")
    for name in _PATHFINDER_MAIN:
        if name in params:
            default = params[name].default
            shown = "automatic" if default is None else default
            p.add_argument(
                "--" + name.replace("_", "-"),
                type=int,
                default=None,
                help=f"default {shown}" if default is not inspect.Parameter.empty else None,
            )
    scene = getattr(pathfinder, "SceneParams", None)
    if scene is not None:  # geometry overrides, typed like the scene's defaults
        for fld in dataclasses.fields(scene):
            if fld.name in _PATHFINDER_MAIN or fld.name in ("resolution",):
                continue
            kind = type(fld.default) if fld.default is not dataclasses.MISSING else float
            if kind not in (int, float):
                continue
            p.add_argument(
                "--" + fld.name.replace("_", "-"),
                dest="geometry_" + fld.name,
                type=kind,
                default=None,
                metavar=fld.name.upper(),
                help=f"scene geometry override (SceneParams.{fld.name}, {fld.default} at resolution 32)",
            )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_generate_pathfinder)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``longrange data`` and its subcommands."""
    data = subparsers.add_parser(
        "data",
        help="list, check, prepare and generate data sets",
        description="Data sets: list the tasks, check their files, prepare the cache, "
        "generate synthetic sets. See docs/data.md.",
    )
    sub = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    data.set_defaults(func=lambda args: (data.print_help(), 2)[1])

    p = sub.add_parser("list", help="the tasks with kind, length, classes, metric and mask ratio")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("info", help="what a task expects, whether its files are present, how to obtain them")
    _add_task_args(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("prepare", help="read a task once and cache the prepared tensors")
    _add_task_args(p)
    p.add_argument("--skip-bad", action="store_true", help="skip malformed records (counted) instead of failing")
    p.set_defaults(func=cmd_prepare)

    gen = sub.add_parser("generate", help="generate a synthetic task (listops, pathfinder)")
    gen_sub = gen.add_subparsers(dest="generator", metavar="TASK")
    gen.set_defaults(func=lambda args: (gen.print_help(), 2)[1])
    _register_generate_listops(gen_sub)
    if importlib.util.find_spec("longrange.data.generate.pathfinder") is not None:
        _register_generate_pathfinder(gen_sub)
