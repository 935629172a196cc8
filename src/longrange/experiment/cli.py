"""Experiment commands: train, pretrain, finetune, compare, presets, demo."""

from __future__ import annotations

import argparse
import json

from longrange.errors import ConfigError


def _add_experiment_args(p: argparse.ArgumentParser, out_help: str) -> None:
    p.add_argument("--preset", help="a built-in preset (see `longrange presets`) or a YAML experiment file")
    p.add_argument(
        "--config",
        help="a YAML experiment file (applied on top of the preset), or the configuration file "
        "of a run's directory, to run it again (its run fields left out)",
    )
    p.add_argument("--out", required=True, help=out_help)
    p.add_argument(
        "--seed", type=int, default=None, help="training seed (default: the experiment's train.seed, else 0)"
    )
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--overwrite", action="store_true", help="start afresh even if --out holds a run")
    p.add_argument(
        "--continue",
        dest="continue_run",
        action="store_true",
        help="resume the run in --out if it holds one made with these settings (a finished one is left as "
        "it is), else start it: for job scripts that may be requeued",
    )
    add_data_args(p)
    p.add_argument(
        "settings",
        nargs="*",
        metavar="FIELD=VALUE",
        help="overrides by dotted name, e.g. model.d_model=128 train.lr=3e-4",
    )


def add_data_args(p: argparse.ArgumentParser) -> None:
    """``--data-dir`` and ``--skip-bad``: the command-line spelling of ``task.data_dir`` and
    ``task.skip_bad`` (see :func:`data_settings`)."""
    p.add_argument(
        "--data-dir",
        default=None,
        metavar="DIR",
        help="root data directory (task.data_dir; default $LONGRANGE_DATA or ./data)",
    )
    p.add_argument(
        "--skip-bad",
        action="store_true",
        help="skip malformed records, counted in the run's record, instead of stopping (task.skip_bad)",
    )


def data_settings(args: argparse.Namespace, settings: list[str] | None) -> list[str]:
    """``settings`` plus the overrides that ``--data-dir`` and ``--skip-bad`` stand for; giving a
    field both ways is an error rather than a silent choice."""
    settings = list(settings or [])
    extra = []
    if getattr(args, "data_dir", None) is not None:
        extra.append(("task.data_dir", json.dumps(str(args.data_dir)), "--data-dir"))
    if getattr(args, "skip_bad", False):
        extra.append(("task.skip_bad", "true", "--skip-bad"))
    for key, value, flag in extra:
        if any(s.partition("=")[0].strip() == key for s in settings):
            raise ConfigError(f"{flag} and {key}=... both given; give one of them")
        settings.append(f"{key}={value}")
    return settings


def _resolve(args: argparse.Namespace):
    from longrange.experiment.config import resolve

    return resolve(args.preset, args.config, data_settings(args, args.settings))


def _print_summary(summary: dict) -> None:
    from longrange.train.distributed import is_main_process

    if is_main_process():  # under torchrun every rank returns the same summary
        print(json.dumps(summary, indent=2))


def _run_stage(args: argparse.Namespace, exp, stage: str, **options) -> int:
    """``longrange train|pretrain|finetune``: resolve ``stage`` of ``exp``, run it in ``--out`` as
    ``--resume``/``--overwrite``/``--continue`` ask, and print its summary."""
    from longrange.experiment.execute import run_stage
    from longrange.experiment.stage import resolve_stage
    from longrange.train.rundir import Intent

    intent = Intent.from_flags(args.resume, args.overwrite, args.continue_run)
    _print_summary(run_stage(resolve_stage(exp, stage, seed=args.seed, **options), args.out, intent))
    return 0


def _train(args: argparse.Namespace) -> int:
    return _run_stage(args, _resolve(args), "train")


def _pretrain(args: argparse.Namespace) -> int:
    from longrange.objectives.factory import natural_objective

    exp = _resolve(args)
    objective = args.objective or natural_objective(exp.model.direction)  # as compare chooses
    return _run_stage(args, exp, "pretrain", objective=objective, reverse=args.reverse)


def _finetune(args: argparse.Namespace) -> int:
    return _run_stage(args, _resolve(args), "finetune", init_from=args.init_from, reverse_from=args.reverse_from)


def _compare_status(out: str) -> int:
    from longrange.experiment.backends import jobs_file, read_jobs
    from longrange.experiment.compare import stage_statuses
    from longrange.experiment.plan import Plan, describe

    plan = Plan.load(out)
    statuses = stage_statuses(out, plan)
    print(describe(plan, statuses))
    counts = {k: list(statuses.values()).count(k) for k in ("finished", "held", "resumable", "pending", "failed")}
    print(", ".join(f"{v} {k}" for k, v in counts.items() if v))
    ids = read_jobs(out)
    if ids is not None:  # compare --launcher slurm: the SLURM job of each stage
        pending = [f"{sid} {ids[sid]}" for sid in ids if statuses.get(sid) != "finished"]
        print(f"SLURM jobs ({jobs_file(out)}): " + (", ".join(pending) if pending else "all done"))
    return 0


def jobs_arg(text: str) -> int | str:
    """``--jobs``: a number of stages at once (>= 1), or ``auto``."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        jobs = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of stages at once or 'auto', got {text!r}") from None
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (or 'auto'), got {jobs}")
    return jobs


def launcher_settings(experiments: list, args: argparse.Namespace):
    """The ``compare.launcher`` section of the experiments (all alike), updated by the command-line options."""
    import dataclasses

    from longrange import typed
    from longrange.experiment.config import LauncherConfig

    base = experiments[0].compare.launcher if experiments else LauncherConfig()
    for exp in experiments[1:]:
        if exp.compare.launcher != base:
            raise ConfigError(
                f"the experiments {experiments[0].label!r} and {exp.label!r} have different "
                "compare.launcher sections; one comparison runs with one launcher"
            )
    changes = {
        name: getattr(args, name)
        for name in (
            "jobs",
            "threads_per_job",
            "partition",
            "time_min",
            "gpus_per_job",
            "cpus_per_job",
            "mem_gb",
            "account",
            "qos",
        )
        if getattr(args, name, None) is not None
    }
    if args.launcher:
        changes["kind"] = args.launcher
    elif args.jobs is not None:
        changes["kind"] = "local"
    if args.slurm_array:
        changes["array"] = True
    if args.no_wait:
        changes["wait"] = False
    extra = dict(base.extra)
    for item in args.sbatch or []:
        if "=" not in item:
            raise ConfigError(f"--sbatch {item!r} is not of the form option=value (e.g. constraint=a100)")
        key, value = item.split("=", 1)
        extra[key.strip().lstrip("-")] = value
    changes["extra"] = extra
    settings = typed.from_dict(LauncherConfig, {**dataclasses.asdict(base), **changes}, "compare.launcher")
    if not settings.wait and settings.kind != "slurm":
        raise ConfigError("--no-wait is for --launcher slurm (local runs end when the stages do)")
    return settings


def _compare(args: argparse.Namespace) -> int:
    from longrange.experiment.backends import make_backend
    from longrange.experiment.cells import model_groups, named_cells
    from longrange.experiment.compare import compare
    from longrange.experiment.params import WIDTH

    if args.status:
        return _compare_status(args.status)
    if args.export:
        from longrange.experiment.export import export_results

        print("\n".join(export_results(*args.export).lines()))
        return 0
    if not args.out:
        raise ConfigError(
            "give --out DIR (the directory of all runs and the report), --status DIR or --export DIR DEST"
        )
    found = named_cells(args.preset or [], args.config or [], data_settings(args, args.settings))
    experiments = [cell.exp for cell in found]
    if args.match_params and any(s.partition("=")[0].strip() == WIDTH and "," in s for s in args.settings or []):
        raise ConfigError(
            f"--match-params sets {WIDTH} of every model after the first to match the first's parameter count, so a "
            f"sweep of {WIDTH} would hold for the first model only and the labels would name widths the others do not "
            f"have: sweep another field (e.g. model.n_layers=2,4: each value's models are matched to its first), or "
            f"give each model its width (`longrange params --match PRESET --vary {WIDTH}` finds them)"
        )
    try:
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    except ValueError:
        raise ConfigError(f"--seeds must be comma-separated integers, got {args.seeds!r}") from None
    objectives = args.objectives.split(",") if args.objectives else None
    settings = launcher_settings(experiments, args)
    compare(
        experiments,
        args.out,
        seeds=seeds,
        objectives=objectives,
        compute_matched=False if args.no_compute_matched else None,
        train_subsets=parse_train_subsets(args.train_subsets),
        overwrite=args.overwrite,
        rerun_other_versions=args.rerun_other_versions,
        dry_run=args.dry_run,
        executor=make_backend(settings),
        match_params=args.match_params,
        model_groups=model_groups(found),
    )
    if args.dry_run or not settings.wait:
        return 0
    from longrange.report.writer import report_and_verdict

    print(report_and_verdict(args.out))
    return 0


def parse_train_subsets(text: str | None) -> list[float | int] | None:
    """``--train-subsets 0.05,0.1,1.0,500``: fractions (with a decimal point or exponent) and counts."""
    if not text:
        return None
    out: list[float | int] = []
    for item in text.split(","):
        item = item.strip()
        try:
            out.append(float(item) if any(c in item for c in ".eE") else int(item))
        except ValueError:
            raise ConfigError(
                f"--train-subsets must be comma-separated fractions in (0, 1] or counts, got {item!r} in {text!r}"
            ) from None
    return out


def presets_text(prefix: str = "", full: bool = False) -> str:
    """``longrange presets``: the presets grouped by family (the first part of their names), each group
    headed by the paper its presets come from, one short line per preset (``full``: with its whole
    source, files and lines)."""
    from longrange.experiment.config import experiment_from_dict, list_presets, load_preset
    from longrange.experiment.fidelity import cited, family_paper

    groups: dict[str, list] = {}
    for name in list_presets():
        if not name.startswith(prefix):
            continue
        groups.setdefault(name.split("/")[0], []).append((name, experiment_from_dict(load_preset(name))))
    lines = []
    for family, items in groups.items():
        paper = family_paper(family, [exp.source for _, exp in items])
        lines.append(f"{family}/ ({len(items)} preset{'s' if len(items) != 1 else ''}){': ' + paper if paper else ''}")
        width = max(len(name) for name, _ in items)
        tasks = max(len(exp.task.name) for _, exp in items)
        models = max(len(exp.model.describe()) for _, exp in items)
        for name, exp in items:
            its_paper, where = cited(exp.source)
            where = where if its_paper == paper else f"{its_paper}, {where}".strip(", ")
            where = where if len(where) <= 32 else where[:31] + "…"
            lines.append(
                f"  {name:{width}s}  {exp.task.name:{tasks}s}  {exp.model.describe():{models}s}  {where}".rstrip()
            )
            if full and exp.source:
                lines.append(f"  {'':{width}s}  source: {exp.source}")
        lines.append("")
    count = sum(len(v) for v in groups.values())
    lines.append(
        f"{count} presets: name, task, model, and where in the paper (`longrange presets --long`: the "
        "sources, files and lines;"
    )
    lines.append(
        "`longrange presets --fidelity NAME`: every published field against ours; "
        "`longrange params --preset NAME`: its size)"
    )
    return "\n".join(lines)


def _presets(args: argparse.Namespace) -> int:
    if args.fidelity:
        from longrange.experiment.fidelity import preset_listing

        if args.prefix or args.long:
            raise ConfigError("--fidelity NAME prints one preset's fields: give it without a prefix or --long")
        print(preset_listing(args.fidelity), end="")
        return 0
    print(presets_text(args.prefix, args.long))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from longrange.experiment.demo import run_demo

    print(run_demo(args.out, jobs=args.jobs, which=args.name))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model on a task from scratch (supervised)")
    _add_experiment_args(p, "run directory")
    p.set_defaults(func=_train)

    p = sub.add_parser("pretrain", help="self-pretrain on the task's own training inputs (causal or masked)")
    _add_experiment_args(p, "run directory")
    p.add_argument(
        "--objective",
        choices=("causal", "masked"),
        default=None,
        help="default: causal for causal models, masked for bidirectional ones (as compare)",
    )
    p.add_argument(
        "--reverse", action="store_true", help="causal pretraining on reversed sequences (the R1 model of F1R1)"
    )
    p.set_defaults(func=_pretrain)

    p = sub.add_parser("finetune", help="finetune a pretrained run on the task's labels")
    _add_experiment_args(p, "run directory")
    p.add_argument("--from", dest="init_from", required=True, help="the pretraining run directory")
    p.add_argument("--reverse-from", help="a reverse-pretrained run: fuse it as the reverse branches (F1R1)")
    p.set_defaults(func=_finetune)

    p = sub.add_parser(
        "compare",
        help="scratch vs self-pretraining for one or more models over seeds, with a report",
        description="Cells: each --preset x each --config x each combination of swept values "
        "(FIELD=A,B), labelled by what varies; see docs/sweeps-and-verdict.md.",
    )
    p.add_argument(
        "--preset", action="append", help="a built-in preset or a YAML experiment file; repeat for several models"
    )
    p.add_argument(
        "--config",
        action="append",
        help="a YAML file applied on top of each preset (repeatable: each a cell; alone, each config is an experiment)",
    )
    p.add_argument(
        "--match-params",
        action="store_true",
        help="set the width (model.d_model) of each model after the first to match the first's parameter count",
    )
    p.add_argument("--out", help="directory of all runs and the report")
    p.add_argument(
        "--status",
        metavar="OUT",
        help="show each stage of the comparison in OUT (pending, held, resumable, finished, failed) and exit",
    )
    p.add_argument(
        "--export",
        nargs=2,
        metavar=("OUT", "DEST"),
        help="copy the results of the comparison or study in OUT (compare, mad, zoology) to DEST without "
        "checkpoints and unfinished stages, small enough for a repository; --out DEST continues it, and exit",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the plan (stages and their dependencies) and run nothing"
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="run again the finished stages that were made with other settings (others are reused)",
    )
    p.add_argument(
        "--rerun-other-versions",
        action="store_true",
        help="run again the finished stages that another longrange version made (by default they are reused)",
    )
    p.add_argument("--seeds", help="comma-separated seeds (default: the preset's compare.seeds)")
    p.add_argument(
        "--objectives",
        help="comma-separated SPT objectives: causal,masked (default: the preset's, or the model's natural one)",
    )
    p.add_argument("--no-compute-matched", action="store_true", help="skip the compute-matched scratch baseline")
    p.add_argument(
        "--train-subsets",
        metavar="LIST",
        help="a data-fraction sweep: comma-separated fractions in (0, 1] (0.05,0.1,1.0) or counts (500); "
        "every stage, pretraining included, runs once per subset (default: the preset's compare.train_subsets)",
    )
    add_data_args(p)
    g = p.add_argument_group("running the grid (override the config's compare.launcher; see docs/cluster.md)")
    g.add_argument(
        "--jobs",
        type=jobs_arg,
        help="run up to N stages at once as worker processes on this machine (default 1: "
        "in this process); auto: one per GPU, else one per core with one thread each",
    )
    g.add_argument("--threads-per-job", type=int, help="torch/OMP threads per worker (default: cores // jobs)")
    g.add_argument(
        "--launcher", choices=("local", "slurm"), help="local (this machine) or slurm (jobs through submitit)"
    )
    g.add_argument("--partition", help="slurm: the partition")
    g.add_argument("--time-min", type=int, help="slurm: time limit per job in minutes (default 240)")
    g.add_argument(
        "--gpus-per-job", type=int, help="slurm: GPUs per job (default 1; >1 runs the stage under torchrun; 0: CPU)"
    )
    g.add_argument("--cpus-per-job", type=int, help="slurm: CPUs per job")
    g.add_argument("--mem-gb", type=float, help="slurm: memory per job in GB")
    g.add_argument("--account", help="slurm: the account to charge")
    g.add_argument("--qos", help="slurm: the quality of service")
    g.add_argument(
        "--sbatch",
        action="append",
        metavar="OPTION=VALUE",
        help="slurm: another sbatch option (repeatable), e.g. constraint=a100",
    )
    g.add_argument(
        "--slurm-array",
        action="store_true",
        help="slurm: one job array per dependency level instead of one job per stage",
    )
    g.add_argument("--no-wait", action="store_true", help="slurm: return once the jobs are submitted (print their ids)")
    p.add_argument(
        "settings",
        nargs="*",
        metavar="FIELD=VALUE",
        help="overrides applied to every experiment; FIELD=A,B sweeps the field (a cell per value)",
    )
    p.set_defaults(func=_compare)

    p = sub.add_parser("presets", help="list the built-in experiment presets")
    p.add_argument("prefix", nargs="?", default="", help="only presets whose name starts with this")
    p.add_argument("--long", action="store_true", help="also each preset's full source (paper, files and lines)")
    p.add_argument(
        "--fidelity",
        metavar="NAME",
        help="the preset's every published field: the source's value, where "
        'it is published, ours, and "same" or why ours differs (docs/fidelity.md lists the differences)',
    )
    p.set_defaults(func=_presets)

    p = sub.add_parser(
        "demo",
        help="scratch vs causal SPT for a Transformer and a DLR on a generated associative "
        "recall with 250 and 1,000 labels over 3 seeds, with the computed verdict and ranking; no data "
        "needed (about 6 min on 2 CPU cores; `demo listops`: the ListOps demo, about 5 min)",
    )
    p.add_argument(
        "name",
        nargs="?",
        default="recall",
        choices=("recall", "listops"),
        help="recall (default): the recall demo; listops: a small DLR on a generated short ListOps, "
        "scratch vs masked SPT vs matched compute over 5 seeds",
    )
    p.add_argument(
        "--out",
        default=None,
        help="directory of the runs and the report (default runs/demo, runs/demo-listops for the ListOps demo)",
    )
    p.add_argument(
        "--jobs",
        type=jobs_arg,
        default=None,
        help="stages at once as worker processes (default auto: one per core, one thread each; 1 = in this process)",
    )
    p.set_defaults(func=_demo)
