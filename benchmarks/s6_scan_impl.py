"""The S6 rows of ``longrange bench`` with two selective-scan implementations, side by side.

Usage: python benchmarks/s6_scan_impl.py [--rounds 3] [--impls chunked numba] [--out DIR]
       [--models mamba-s6 ...] [extra options for longrange bench, after --]

Runs ``longrange bench --models <S6 models> --scan-impl <impl>`` for each implementation in turn,
``--rounds`` times, so that a machine shared with other work slows every implementation alike,
and prints per model the median seconds per batch, the speed-up of the last implementation over
the first (median and range over the rounds) and the peak memory. The raw rows are written to
``DIR/<impl>_<round>.json`` (default ``benchmarks/results/s6_scan_impl``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

S6_MODELS = ["mamba-s6", "mamba-s6-bi", "mamba-s6-placebo", "mamba-s6-rope", "mamba-s6-rope-trainable", "mamba-s6-sm"]


def run_rounds(impls: list[str], rounds: int, models: list[str], out: Path, extra: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for r in range(1, rounds + 1):
        for impl in impls:
            print(f"round {r}/{rounds}: --scan-impl {impl}", file=sys.stderr, flush=True)
            cmd = [
                sys.executable,
                "-m",
                "longrange",
                "bench",
                "--models",
                *models,
                "--reference",
                models[0],
                "--scan-impl",
                impl,
                "--quiet",
                "--json",
                str(out / f"{impl}_{r}.json"),
                *extra,
            ]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def summarize(impls: list[str], out: Path) -> str:
    """A Markdown table from the JSON files in ``out`` (rounds present for every implementation)."""
    by_model: dict[str, dict[str, dict[str, dict]]] = {}
    for path in out.glob("*_*.json"):
        impl, _, r = path.stem.rpartition("_")
        for row in json.loads(path.read_text())["rows"]:
            by_model.setdefault(row["model"], {}).setdefault(impl, {})[r] = row
    first, last = impls[0], impls[-1]
    lines = [
        f"| model | rounds | train s/batch {first} | train s/batch {last} | train speed-up (range) | "
        f"infer speed-up (range) | train MB {first} -> {last} | infer MB {first} -> {last} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, rows in by_model.items():
        rounds = sorted(set.intersection(*(set(rows.get(i, {})) for i in impls)))
        if not rounds:
            continue
        a, b = rows[first], rows[last]
        med = lambda key, side: statistics.median(side[r][key] for r in rounds)  # noqa: E731
        ratio = lambda key: [a[r][key] / b[r][key] for r in rounds]  # noqa: E731
        train, infer = ratio("train_s_per_batch"), ratio("infer_s_per_batch")
        lines.append(
            f"| {model} | {len(rounds)} | {med('train_s_per_batch', a):.3f} | {med('train_s_per_batch', b):.3f} | "
            f"{statistics.median(train):.2f}x ({min(train):.2f}-{max(train):.2f}) | "
            f"{statistics.median(infer):.2f}x ({min(infer):.2f}-{max(infer):.2f}) | "
            f"{med('train_peak_mb', a):.0f} -> {med('train_peak_mb', b):.0f} | {med('infer_peak_mb', a):.0f} -> {med('infer_peak_mb', b):.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--impls", nargs="+", default=["chunked", "numba"])
    p.add_argument("--models", nargs="+", default=S6_MODELS)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "s6_scan_impl")
    p.add_argument("--summarize-only", action="store_true", help="only print the table from existing JSON files")
    args = p.parse_args(argv)
    if not args.summarize_only:
        run_rounds(args.impls, args.rounds, args.models, args.out, extra)
    print(summarize(args.impls, args.out))


if __name__ == "__main__":
    main()
