"""The ``longrange`` command line.

Each subsystem owns its subcommands in a module with a ``register(subparsers)`` function that adds
its parsers and sets ``func`` (called with the parsed namespace, returning an exit code).

Every subcommand parses its arguments intermixed: positionals (``FIELD=VALUE`` overrides, run
directories, task names) may come before, between or after the options, e.g.
``longrange train --preset p train.lr=3e-4 --out runs/x model.d_model=64``.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from longrange.errors import LongrangeError, Preempted

#: Modules that add subcommands, in the order they are listed in ``longrange --help``.
COMMAND_MODULES: list[str] = [
    "longrange.experiment.params_cli",
    "longrange.data.cli",
    "longrange.experiment.cli",
    "longrange.inference_cli",
    "longrange.bench.cli",
    "longrange.bench.plan_cli",
    "longrange.report.cli",
    "longrange.info",
    "longrange.check",
]


#: Commands that continue where they stopped when run again (they have no ``--resume``), and how to say so.
RESUMED_BY_RERUNNING = {
    "compare": "run the same compare command again to continue (finished stages are reused, interrupted ones "
               "resume from their last checkpoints)",
    "demo": "run the demo again to continue (finished stages are reused, interrupted ones resume)",
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


def build_parser() -> argparse.ArgumentParser:
    from longrange import __version__

    parser = CommandParser(
        prog="longrange",
        description="Long-sequence models, self-pretraining and fair comparison on long-range benchmarks.",
    )
    parser.add_argument("--version", action="version", version=f"longrange {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except Preempted as err:  # stopped on request, with a checkpoint: a status job scripts requeue on
        if args.command in RESUMED_BY_RERUNNING:
            print(f"longrange {args.command}: stopped at step {err.step} of {err.total} of a stage, its checkpoint "
                  f"written; {RESUMED_BY_RERUNNING[args.command]}", file=sys.stderr)
        else:
            print(f"longrange {args.command}: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:  # Ctrl-C: what was running has already said what it kept; no traceback
        how = RESUMED_BY_RERUNNING.get(args.command) or ("`--resume` continues from the last checkpoint"
                                                         if args.command in ("train", "pretrain", "finetune") else "")
        print(f"longrange {args.command}: interrupted" + (f"; {how}" if how else ""), file=sys.stderr)
        return 130
    except LongrangeError as err:  # user errors: one clear line, no traceback
        print(f"longrange {args.command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
