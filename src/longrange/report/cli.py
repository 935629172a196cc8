"""``longrange report``: tables with 95% confidence intervals and PNG plots from run directories.

    longrange report RUNS... [--out DIR] [--format md|csv] [--csv PATH] [--no-plots] [--kernels]
                             [--kernel-length L]

prints the tables and writes ``report.md`` and the PNGs into ``--out`` (default: the first RUNS
path, when it is a directory).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from longrange.errors import ConfigError
from longrange.report.writer import REPORT_FILE, write_report
from longrange.train.rundir import SUMMARY_FILE


def _run(args: argparse.Namespace) -> int:
    from longrange.fileio import check_out_dir

    paths = [Path(p) for p in args.runs]
    out = args.out
    if out is not None:
        check_out_dir(out)  # a file in the way is a one-line error before any work
    if out is None:
        if not paths[0].is_dir():
            raise ConfigError(f"--out is needed: the first RUNS path {paths[0]} is not a directory")
        out = paths[0]
    if args.kernel_length is not None and args.kernel_length < 1:
        raise ConfigError(f"--kernel-length must be positive, got {args.kernel_length}")
    text = write_report(
        paths,
        out,
        plots=not args.no_plots,
        kernels=args.kernels,
        kernel_length=args.kernel_length,
        csv_path=args.csv,
        text_format=args.format,
    )
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    print(f"report written to {Path(out) / REPORT_FILE}", file=sys.stderr)
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "report",
        help="tables (mean ± 95%% CI over seeds) and plots from run directories",
        description=f"Aggregate finished runs ({SUMMARY_FILE}) over seeds into Markdown/CSV tables and PNG plots.",
    )
    p.add_argument("runs", nargs="+", metavar="RUNS", help="run directories or trees searched recursively")
    p.add_argument(
        "--out", default=None, help="directory for report.md and the PNGs (default: the first RUNS directory)"
    )
    p.add_argument("--format", choices=("md", "csv"), default="md", help="what to print on stdout (default md)")
    p.add_argument("--csv", default=None, metavar="PATH", help="also write the per-cell table as CSV to PATH")
    p.add_argument("--no-plots", action="store_true", help="write no PNGs")
    p.add_argument("--kernels", action="store_true", help="analyse the decay of the learned convolution kernels")
    p.add_argument(
        "--kernel-length",
        type=int,
        default=None,
        metavar="L",
        help="kernel length for --kernels (default: the task's seq_len from each run's config, else 1024)",
    )
    p.set_defaults(func=_run)
