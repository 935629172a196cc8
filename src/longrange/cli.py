"""The ``longrange`` command line.

Each subsystem owns its subcommands in a module with a ``register(subparsers)`` function that adds
its parsers and sets ``func`` (called with the parsed namespace, returning an exit code).

Every subcommand parses its arguments intermixed: positionals (``FIELD=VALUE`` overrides, run
directories, task names) may come before, between or after the options, e.g.
``longrange train --preset p train.lr=3e-4 --out runs/x model.d_model=64``.

Start-up: :data:`COMMANDS` names each command, its module and its one-line help, so that
``longrange --help`` imports no command module, and ``longrange COMMAND ...`` imports only the
module of that command (the others are listed by name). A test checks the table against what the
modules register.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from longrange.errors import LongrangeError, Preempted

#: Modules that add subcommands, in the order they are listed in ``longrange --help``.
COMMAND_MODULES: list[str] = [
    "longrange.listing",
    "longrange.experiment.params_cli",
    "longrange.data.cli",
    "longrange.experiment.cli",
    "longrange.inference_cli",
    "longrange.bench.cli",
    "longrange.bench.plan_cli",
    "longrange.report.cli",
    "longrange.studies.cli",
    "longrange.info",
    "longrange.check",
]

#: command -> (its module, its help line), in the order of ``longrange --help``.
COMMANDS: dict[str, tuple[str, str]] = {
    "list": (
        "longrange.listing",
        "everything registered (primitives, blocks, heads, objectives, tasks, ops), with options and defaults",
    ),
    "params": (
        "longrange.experiment.params_cli",
        "parameter counts, in total and inside the sequence primitives "
        "(default: the thesis' Table 3 models); --match finds the width that matches another model's count",
    ),
    "data": ("longrange.data.cli", "list, check, prepare and generate data sets"),
    "train": ("longrange.experiment.cli", "train a model on a task from scratch (supervised)"),
    "pretrain": ("longrange.experiment.cli", "self-pretrain on the task's own training inputs (causal or masked)"),
    "finetune": ("longrange.experiment.cli", "finetune a pretrained run on the task's labels"),
    "compare": (
        "longrange.experiment.cli",
        "scratch vs self-pretraining for one or more models over seeds, with a report",
    ),
    "presets": ("longrange.experiment.cli", "list the built-in experiment presets"),
    "demo": (
        "longrange.experiment.cli",
        "scratch vs causal SPT for a Transformer and a DLR on a generated associative "
        "recall with 250 and 1,000 labels over 3 seeds, with the computed verdict and ranking; no data needed "
        "(about 6 min on 2 CPU cores; `demo listops`: the ListOps demo, about 5 min)",
    ),
    "predict": ("longrange.inference_cli", "a finished run's predictions for new inputs in the task's file format"),
    "evaluate": (
        "longrange.inference_cli",
        "a finished run's metrics on a split, at its own task options or at others",
    ),
    "extrapolate": (
        "longrange.inference_cli",
        "finished runs evaluated at several values of a task option (length extrapolation): a table and a plot",
    ),
    "bench": (
        "longrange.bench.cli",
        "measure training/inference speed and memory, scaling with length, generation speed",
    ),
    "plan": (
        "longrange.bench.plan_cli",
        "plan a preset's training step on a GPU without one: memory, FLOPs, largest batch, step time",
    ),
    "report": ("longrange.report.cli", "tables (mean ± 95%% CI over seeds) and plots from run directories"),
    "mad": (
        "longrange.studies.cli",
        "MAD's synthetic protocol for a list of models, from scratch and after causal "
        "self-pretraining: tasks, levels, the lr x weight-decay grid, MAD scores",
    ),
    "zoology": (
        "longrange.studies.cli",
        "MQAR accuracy against each model's state size over widths, from scratch and "
        "after causal self-pretraining (Zoology's axis at a vocabulary that separates models on a CPU)",
    ),
    "info": ("longrange.info", "versions, devices, optional kernels, and which implementation each op runs where"),
    "check": (
        "longrange.check",
        "check every implementation available here against its float64 reference, and step == forward",
    ),
}


#: Commands that continue where they stopped when run again (they have no ``--resume``), and how to say so.
RESUMED_BY_RERUNNING = {
    "zoology": "run the same zoology command again to continue (finished runs are reused, an interrupted one "
    "resumes from its checkpoint where it wrote one)",
    "mad": "run the same mad command again to continue (finished runs are reused, an interrupted one resumes "
    "from its checkpoint where it wrote one)",
    "compare": "run the same compare command again to continue (finished stages are reused, an interrupted one "
    "resumes from its checkpoint where it wrote one)",
    "demo": "run the demo again to continue (finished stages are reused, an interrupted one resumes from its "
    "checkpoint where it wrote one)",
}


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose leaf commands (those without subcommands of their own) accept
    positionals anywhere among the options (``parse_intermixed_args``).

    Subparsers created by ``add_subparsers`` inherit the class, so every level of ``longrange``
    uses it; a parser with subcommands parses as usual (argparse cannot intermix those).
    """

    _intermixing = False

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        if self._intermixing or self._subparsers is not None:
            return super().parse_known_args(args, namespace)
        self._intermixing = True  # parse_known_intermixed_args calls back into parse_known_args
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def build_parser(command: str | None = "all") -> argparse.ArgumentParser:
    """The parser of ``longrange``. ``command``: the command whose module registers its real parser
    (``"all"``: every module, as tests and documentation tools want them); the other commands get
    a placeholder with their help line, enough for ``longrange --help`` and to be named."""
    from longrange import __version__

    parser = CommandParser(
        prog="longrange",
        description="Long-sequence models, self-pretraining and fair comparison on long-range benchmarks.",
    )
    parser.add_argument("--version", action="version", version=f"longrange {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = COMMAND_MODULES if command == "all" else [COMMANDS[command][0]] if command in COMMANDS else []
    for module in wanted:
        importlib.import_module(module).register(sub)
    for name, (_module, help_line) in COMMANDS.items():
        if name not in sub.choices:
            sub.add_parser(name, help=help_line)
    # The order of --help: the table's.
    sub._choices_actions.sort(key=lambda a: list(COMMANDS).index(a.dest) if a.dest in COMMANDS else len(COMMANDS))
    return parser


def _command(argv: list[str]) -> str | None:
    """The command named in ``argv`` (its first word that is not an option), or None."""
    for word in argv:
        if not word.startswith("-"):
            return word
        if word in ("-h", "--help", "--version"):
            return None
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = _command(argv)
    if command is not None and command not in COMMANDS:
        from longrange.typed import did_you_mean

        print(
            f"longrange: error: unknown command {command!r}{did_you_mean(command, COMMANDS, quote=True)}; "
            f"commands: {', '.join(COMMANDS)} (`longrange --help` says what each does)",
            file=sys.stderr,
        )
        return 2
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from longrange.train.denormals import flushed

    try:
        # subnormal floats flushed on the CPU from the start, so that the threads a command starts
        # inherit it (train/denormals.py); the mode found is restored when the command returns
        with flushed("cpu"):
            return int(args.func(args) or 0)
    except Preempted as err:  # stopped on request, with a checkpoint: a status job scripts requeue on
        if args.command in RESUMED_BY_RERUNNING:
            what = "interrupted" if err.interrupted else "stopped"
            print(
                f"longrange {args.command}: {what} at step {err.step} of {err.total} of a stage, its checkpoint "
                f"written; {RESUMED_BY_RERUNNING[args.command]}",
                file=sys.stderr,
            )
        else:
            print(f"longrange {args.command}: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:  # Ctrl-C outside training, or twice: what was running has said what it kept
        how = RESUMED_BY_RERUNNING.get(args.command) or (
            "`--resume` continues from the last checkpoint, if one was written"
            if args.command in ("train", "pretrain", "finetune")
            else ""
        )
        print(f"longrange {args.command}: interrupted" + (f"; {how}" if how else ""), file=sys.stderr)
        return 130
    except LongrangeError as err:  # user errors: one clear line, no traceback
        print(f"longrange {args.command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
