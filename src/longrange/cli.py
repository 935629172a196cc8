"""The ``longrange`` command line.

Each subsystem owns its subcommands in a module with a ``register(subparsers)`` function that adds
its parsers and sets ``func`` (called with the parsed namespace, returning an exit code).
"""
from __future__ import annotations

import argparse
import importlib
import sys

from longrange.errors import LongrangeError

#: Modules that add subcommands, in the order they are listed in ``longrange --help``.
COMMAND_MODULES: list[str] = [
    "longrange.models.cli",
    "longrange.data.cli",
    "longrange.experiment.cli",
    "longrange.bench.cli",
    "longrange.report.cli",
    "longrange.info",
]


def build_parser() -> argparse.ArgumentParser:
    from longrange import __version__

    parser = argparse.ArgumentParser(
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
    except LongrangeError as err:  # user errors: one clear line, no traceback
        print(f"longrange {args.command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
