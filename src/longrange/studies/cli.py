"""``longrange mad`` (MAD's protocol, :mod:`longrange.studies.mad`) and ``longrange zoology`` (MQAR accuracy
against state size, :mod:`longrange.studies.zoology`), each from scratch and with causal self-pretraining."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from longrange.errors import ConfigError

HELP = (
    "MAD's synthetic protocol for a list of models, from scratch and after causal self-pretraining: tasks, "
    "levels, the lr x weight-decay grid, MAD scores"
)


def _list(text: str | None, kind=str, option: str = "") -> tuple | None:
    """A comma-separated option's values, each converted by ``kind``; a bad one is a ConfigError naming the option."""
    if text is None:
        return None
    try:
        return tuple(kind(part.strip()) for part in text.split(",") if part.strip())
    except ValueError:
        what = {int: "integers", float: "numbers"}.get(kind, "values")
        raise ConfigError(f"{option}: expected comma-separated {what}, got {text!r}") from None


def settings_from_args(args: argparse.Namespace):
    from longrange.studies.mad import CPU_MODELS, CPU_PROTOCOL, MadSettings

    given: dict[str, Any] = {"models": CPU_MODELS, **CPU_PROTOCOL} if args.cpu else {}
    for name, kind in (
        ("models", str),
        ("tasks", str),
        ("levels", str),
        ("lrs", float),
        ("wds", float),
        ("seeds", int),
        ("regimes", str),
    ):
        value = _list(getattr(args, name), kind, f"--{name}")
        if value is not None:
            given[name] = value
    for name in ("pretrain_lr", "pretrain_wd", "train_targets"):
        if getattr(args, name) is not None:
            given[name] = getattr(args, name)
    if args.screen:
        given["screen"] = True
    if args.settings:
        given["overrides"] = tuple(given.get("overrides", ())) + tuple(args.settings)
    settings = MadSettings(**{"models": (), **given})
    if args.grid_from:
        from longrange.studies.mad import fix_from_screen

        settings = fix_from_screen(settings, args.grid_from)
    return settings


def _mad(args: argparse.Namespace) -> int:
    from longrange.experiment.backends import LocalWorkers, resolve_jobs
    from longrange.studies.mad_report import report_from_runs, run_mad, write_report

    if args.report:
        paths = write_report(report_from_runs(args.out), args.out)
        print(paths["markdown"].read_text())
        return 0
    settings = settings_from_args(args)
    claims = None
    if args.grid_from:
        from longrange.studies.mad_report import screen_claims_of

        claims = screen_claims_of(args.grid_from)
        if claims is None:
            print(
                f"note: the screen in {args.grid_from} is not finished, so it has no claims yet: this confirmation "
                "reports what it measures and tests none",
                file=sys.stderr,
            )
    jobs = resolve_jobs(args.jobs if args.jobs is not None else "auto" if args.cpu else 1)
    report = run_mad(
        settings,
        args.out,
        executor=LocalWorkers(jobs) if jobs > 1 else None,
        dry_run=args.dry_run,
        overwrite=args.overwrite,
        claims=claims,
    )
    if report is not None:
        print(report.markdown())
    return 0


ZOOLOGY_HELP = (
    "MQAR accuracy against each model's state size over widths, from scratch and after causal "
    "self-pretraining (Zoology's axis at a vocabulary that separates models on a CPU)"
)


def _zoology(args: argparse.Namespace) -> int:
    from longrange.data.cli import parse_task_options
    from longrange.experiment.backends import LocalWorkers, resolve_jobs
    from longrange.studies.zoology import DEFAULT_WIDTHS, run_zoology

    models = _list(args.models, str, "--models") or ()
    widths = _list(args.widths, int, "--widths") if args.widths else DEFAULT_WIDTHS
    study = dict(
        seeds=_list(args.seeds, int, "--seeds") or (0,),
        task_options=parse_task_options("mqar", args.task_option or []),
        overrides=args.settings,
        field=args.field,
    )
    if args.report and args.dry_run:
        raise ConfigError("--report and --dry-run: choose one (--report runs nothing either)")
    jobs = resolve_jobs(args.jobs)
    executor = LocalWorkers(jobs) if jobs > 1 and not args.report else None
    text = run_zoology(
        models, widths, args.out, executor=executor, dry_run=args.dry_run, report_only=args.report, **study
    )
    if text:
        print(text)
    return 0


def register(sub: Any) -> None:
    from longrange.experiment.cli import jobs_arg

    p = sub.add_parser("mad", help=HELP, description=HELP + ". Resumable: run the same command again to continue.")
    p.add_argument(
        "settings",
        nargs="*",
        metavar="FIELD=VALUE",
        help="settings applied to every run after MAD's (e.g. train.max_steps=500 model.d_model=64)",
    )
    p.add_argument("--out", required=True, help="the study's directory (its runs, mad.json and the report)")
    p.add_argument(
        "--models",
        help="comma-separated: MAD layers (hyena, mamba, mh-attention, ...) or any primitive "
        "(gated-deltanet, mamba2, lru, ...), each in MAD's stack X swiglu X swiglu; a name that is "
        "both (attention, hyena, linear-attention) is MAD's layer",
    )
    p.add_argument("--tasks", help="comma-separated MAD tasks (default: all six; --cpu: the five but compression)")
    p.add_argument(
        "--levels",
        help="comma-separated level names to run where a task has them (baseline, "
        "n_train=800, seq_len=512, ...; default: every level)",
    )
    p.add_argument("--lrs", help="learning rates of the grid (default MAD's 1e-4,5e-4,1e-3)")
    p.add_argument("--wds", help="weight decays of the grid (default MAD's 0,0.1)")
    p.add_argument("--seeds", help="comma-separated seeds (default 0)")
    p.add_argument("--regimes", help="scratch,causal-spt (default both)")
    p.add_argument("--pretrain-lr", type=float, help="self-pretraining's learning rate (default MAD's 5e-4)")
    p.add_argument("--pretrain-wd", type=float, help="self-pretraining's weight decay (default 0)")
    p.add_argument(
        "--train-targets",
        choices=("next-token", "answers"),
        help="the recall tasks' training targets: every next token (MAD's, default) or the answers alone",
    )
    p.add_argument(
        "--screen",
        action="store_true",
        help="no run reads the test split; the report scores the chosen "
        "points' validation accuracies (a screen, before a confirmation on fresh seeds) and, once finished, "
        "makes its claims by a fixed rule (mad_claims.json)",
    )
    p.add_argument(
        "--grid-from",
        metavar="SCREEN",
        help="a confirmation: train each cell only at the grid point the screen in SCREEN chose for it (the "
        "best mean validation accuracy over its seeds), on fresh seeds and a fresh data seed (task.seed=...), "
        "the screen's settings otherwise; its report tests the screen's claims",
    )
    p.add_argument(
        "--cpu",
        action="store_true",
        help="the CPU protocol: 8 models, 2 levels, 2 grid points, width 64, "
        "batch 32, 500 steps (about 5 hours a seed on 2 cores); the options above and FIELD=VALUE settings "
        "change it",
    )
    p.add_argument(
        "--jobs",
        type=jobs_arg,
        default=None,
        help="runs at once as worker processes (default 1; auto, one per core, with --cpu)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan and run nothing")
    p.add_argument("--overwrite", action="store_true", help="run again finished runs made with other settings")
    p.add_argument(
        "--report",
        action="store_true",
        help="write and print the report of the study in --out from its finished runs, running nothing "
        "(a run made with other settings than the study's resolve to now is an error)",
    )
    p.set_defaults(func=_mad)

    z = sub.add_parser(
        "zoology", help=ZOOLOGY_HELP, description=ZOOLOGY_HELP + ". Resumable: run the same command again to continue."
    )
    z.add_argument("settings", nargs="*", metavar="FIELD=VALUE", help="settings applied to every run")
    z.add_argument("--out", required=True, help="the study's directory (its runs and the report)")
    z.add_argument(
        "--models",
        required=True,
        help="comma-separated: the recall study's models (transformer, mamba-s6, "
        "gated-deltanet, lru, ...: demo/recall/<name>) or preset names",
    )
    z.add_argument("--widths", help="comma-separated model widths (default 16,32,64,128)")
    z.add_argument(
        "--field",
        default="d_model",
        choices=("d_model", "d_state"),
        help="the model field the values of --widths set (default d_model; d_state for a layer whose state "
        "does not grow with its width, as the LRU's)",
    )
    z.add_argument("--seeds", help="comma-separated seeds (default 0)")
    z.add_argument(
        "--task-option",
        action="append",
        metavar="NAME=VALUE",
        help="an option of the MQAR task (default vocab_size=64, seq_len=40, n_pairs=8, answers_in_input)",
    )
    z.add_argument("--jobs", type=jobs_arg, default=1, help="runs at once as worker processes (auto: one per core)")
    z.add_argument("--dry-run", action="store_true", help="print the plan and run nothing")
    z.add_argument(
        "--report",
        action="store_true",
        help="write and print the report of the study in --out (the same options) from its finished runs, "
        "running nothing",
    )
    z.set_defaults(func=_zoology)
