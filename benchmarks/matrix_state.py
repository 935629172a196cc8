"""The matrix-state mixers on this CPU: against length beside S6 and attention, the chunked ops
against their loops over time, and SSD against the algorithm of ``ssd_minimal_discrete``.

Usage: python benchmarks/matrix_state.py lengths|naive|minimal|small|all [--threads 2] [--json OUT]
       [--lengths 1024,2048,4096,8192,16384] [--layers mamba2,...] [--ops ssd,...] [--batches 3]

- ``lengths``: each layer of ``longrange.bench.mixers.LAYERS`` (whole layers at batch 8, width 256:
  Mamba-2, Mamba-3 SISO and MIMO, GLA, DeltaNet, Gated DeltaNet, linear attention, S6 in its Mamba block, attention), forward without
  gradients and forward + backward, seconds and peak memory, each length in a fresh process; a layer
  stops after a point over ``--time-budget`` seconds or ``--memory-budget`` MB. Prints, per layer,
  the shortest length from which it is faster than attention (forward + backward).
- ``naive``: each op's chunked form against its loop over time at length 4096 (batch 1, 4 heads of
  64 x 64: the loop's autograd graph keeps a state per position, several GB at batch 8; the goal:
  at least 20x), forward + backward.
- ``small``: the numba kernels of SSD, GLA and the delta rules (``impl="numba"``) against their chunked forms (at
  their default chunk) at the synthetic studies' sizes, batch 32 x length 128 (MAD's cells), for
  heads of states from 8 x 8 to 64 x 64 (``--small-shapes``): where ``"auto"``'s threshold on the
  state's elements (``AUTO_STATE_ELEMENTS``) comes from. Run with ``--threads 1``, as the studies'
  grids train.
- ``minimal``: ``ssd_chunk`` against ``ssd_minimal`` (the published minimal algorithm, written out
  in ``longrange/bench/mixers.py``) on the same inputs, forward + backward (the goal: at least 1.5x),
  at lengths 1024 and 4096.

Timings are means over ``--batches`` calls after one untimed call, in a fresh process per point;
ratios are taken between points of one run. Nothing here is asserted by the tests.
"""

from __future__ import annotations

import argparse
import json
import sys

from longrange.bench import measure
from longrange.bench.mixers import LAYERS, OPS


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v]


def _point(target: str, kwargs: dict, timeout: float) -> dict | None:
    try:
        return measure.run_isolated(target, kwargs, timeout=timeout)
    except measure.IsolatedRunError as err:
        print(f"  failed: {str(err).splitlines()[0]}", file=sys.stderr, flush=True)
        return None


def run_lengths(args: argparse.Namespace) -> list[dict]:
    rows = []
    for name in args.layers:
        for length in args.lengths:
            print(f"{name} L={length}", file=sys.stderr, flush=True)
            row = _point(
                "longrange.bench.mixers:measure_layer",
                {
                    "name": name,
                    "length": length,
                    "batch": args.batch,
                    "d": args.d,
                    "batches": args.batches,
                    "threads": args.threads,
                },
                args.timeout,
            )
            if row is None:
                rows.append({"layer": name, "length": length, "status": "failed"})
                break
            row["status"] = "ok"
            rows.append(row)
            if row["fwdbwd_s"] > args.time_budget or row["fwdbwd_peak_mb"] > args.memory_budget:
                row["status"] = "over budget (longer lengths not run)"
                break
    return rows


def lengths_table(rows: list[dict]) -> str:
    lines = [
        "| layer | params | length | forward (s) | fwd+bwd (s) | peak fwd+bwd (MB) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["status"] == "failed":
            lines.append(f"| {r['layer']} | | {r['length']:,} | failed | | |")
            continue
        lines.append(
            f"| {r['layer']} | {r['params']:,} | {r['length']:,} | {r['forward_s']:.3f} | {r['fwdbwd_s']:.3f} | "
            f"{r['fwdbwd_peak_mb']:.0f} |"
        )
    attention = {r["length"]: r["fwdbwd_s"] for r in rows if r["layer"] == "attention" and r["status"] != "failed"}
    lines += ["", "| layer | faster than attention (fwd+bwd) from length |", "|---|---|"]
    for name in dict.fromkeys(r["layer"] for r in rows if r["layer"] != "attention"):
        mine = {r["length"]: r["fwdbwd_s"] for r in rows if r["layer"] == name and r["status"] != "failed"}
        common = sorted(set(mine) & set(attention))
        faster = [n for n in common if mine[n] < attention[n]]
        beyond = max(mine, default=0) > max(attention, default=0)
        if faster and all(n in faster for n in common if n >= faster[0]):
            text = f"{faster[0]:,}"
        elif faster:
            text = f"at {', '.join(f'{n:,}' for n in faster)}"
        else:
            text = "not within the lengths measured"
        if beyond and attention:
            text += f" (attention stopped after {max(attention):,})"
        lines.append(f"| {name} | {text} |")
    return "\n".join(lines)


def run_naive(args: argparse.Namespace) -> list[dict]:
    rows = []
    for op in args.ops:
        for impl in ("chunk", "naive"):
            print(f"{op} {impl} L={args.naive_length}", file=sys.stderr, flush=True)
            row = _point(
                "longrange.bench.mixers:measure_op",
                {
                    "op": op,
                    "impl": impl,
                    "length": args.naive_length,
                    "batch": args.naive_batch,
                    "batches": 1 if impl == "naive" else args.batches,
                    "threads": args.threads,
                },
                args.timeout,
            )
            rows.append(row or {"op": op, "impl": impl, "length": args.naive_length, "status": "failed"})
    return rows


def run_minimal(args: argparse.Namespace) -> list[dict]:
    rows = []
    for length in (1024, 4096):
        for impl in ("chunk", "minimal"):
            print(f"ssd {impl} L={length}", file=sys.stderr, flush=True)
            row = _point(
                "longrange.bench.mixers:measure_op",
                {
                    "op": "ssd",
                    "impl": impl,
                    "length": length,
                    "batch": args.batch,
                    "batches": args.batches,
                    "threads": args.threads,
                },
                args.timeout,
            )
            rows.append(row or {"op": "ssd", "impl": impl, "length": length, "status": "failed"})
    return rows


#: The ops with numba kernels, which the ``small`` part compares with their chunked forms.
SMALL_OPS = ("ssd", "gla", "gated_delta_rule", "delta_rule")
#: The ``small`` part's heads: (heads, dk, dv), MAD's GLA and DeltaNet (8 heads of 8 x 8 at width 64)
#: and Gated DeltaNet (8 x 16) first; SSD's dk is its state n, dv its headdim (MAD's Mamba-2: 2 x 16 x 64).
SMALL_SHAPES = ((8, 8, 8), (8, 8, 16), (8, 16, 16), (4, 16, 32), (2, 16, 64), (4, 32, 32), (4, 32, 64), (4, 64, 64))


def _shape(text: str) -> tuple[int, int, int]:
    heads, dk, dv = (int(v) for v in text.split("x"))
    return heads, dk, dv


def run_small(args: argparse.Namespace) -> list[dict]:
    rows = []
    for op in SMALL_OPS:
        for heads, dk, dv in args.small_shapes:
            for impl in ("chunk", "numba"):
                print(f"{op} {impl} {heads}x{dk}x{dv}", file=sys.stderr, flush=True)
                kwargs = dict(op=op, impl=impl, length=128, batch=32, heads=heads, dk=dk, dv=dv, chunk_size=None)
                row = _point(
                    "longrange.bench.mixers:measure_op",
                    {**kwargs, "batches": args.batches, "threads": args.threads},
                    args.timeout,
                )
                rows.append(row or {**kwargs, "status": "failed"})
    return rows


def small_table(rows: list[dict]) -> str:
    lines = [
        "| op | heads x dk x dv | state elements | chunk (ms) | numba (ms) | numba speed-up |",
        "|---|---|---:|---:|---:|---:|",
    ]
    by = {(r["op"], r["heads"], r["dk"], r["dv"], r["impl"]): r for r in rows}
    for (op, heads, dk, dv, impl), r in by.items():
        if impl != "chunk":
            continue
        fast = by.get((op, heads, dk, dv, "numba"), {})
        if "fwdbwd_s" not in r or "fwdbwd_s" not in fast:
            lines.append(f"| {op} | {heads} x {dk} x {dv} | {dk * dv:,} | failed | | |")
            continue
        lines.append(
            f"| {op} | {heads} x {dk} x {dv} | {dk * dv:,} | {1e3 * r['fwdbwd_s']:.1f} | "
            f"{1e3 * fast['fwdbwd_s']:.1f} | {r['fwdbwd_s'] / fast['fwdbwd_s']:.2f}x |"
        )
    return "\n".join(lines)


def ratio_table(rows: list[dict], slow: str, title: str) -> str:
    lines = [f"| op | length | chunk (s) | {slow} (s) | {title} |", "|---|---:|---:|---:|---:|"]
    by = {(r["op"], r["impl"], r["length"]): r for r in rows}
    for (op, impl, length), r in by.items():
        if impl != "chunk":
            continue
        other = by.get((op, slow, length))
        if "fwdbwd_s" not in r or other is None or "fwdbwd_s" not in other:
            lines.append(f"| {op} | {length:,} | failed | | |")
            continue
        lines.append(
            f"| {op} | {length:,} | {r['fwdbwd_s']:.3f} | {other['fwdbwd_s']:.3f} | "
            f"{other['fwdbwd_s'] / r['fwdbwd_s']:.1f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=["lengths", "naive", "minimal", "small", "all"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lengths", type=_ints, default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--layers", type=lambda t: t.split(","), default=list(LAYERS))
    p.add_argument("--ops", type=lambda t: t.split(","), default=list(OPS), help="the ops of the naive part")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--naive-length", type=int, default=4096)
    p.add_argument("--naive-batch", type=int, default=1)
    p.add_argument(
        "--small-shapes",
        type=lambda t: [_shape(v) for v in t.split(",") if v],
        default=list(SMALL_SHAPES),
        help="the small part's heads, as HEADSxDKxDV,...",
    )
    p.add_argument("--time-budget", type=float, default=60.0, help="seconds per fwd+bwd call above which a layer stops")
    p.add_argument("--memory-budget", type=float, default=12000.0, help="MB above which a layer stops")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per point")
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args(argv)
    unknown = [n for n in args.layers if n not in LAYERS]
    if unknown:
        p.error(f"unknown layers {unknown}; known: {', '.join(LAYERS)}")
    unknown = [n for n in args.ops if n not in OPS]
    if unknown:
        p.error(f"unknown ops {unknown}; known: {', '.join(OPS)}")
    result: dict = {
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "environment": measure.environment(),
    }
    if args.part in ("lengths", "all"):
        result["lengths"] = run_lengths(args)
        print(lengths_table(result["lengths"]), flush=True)
    if args.part in ("naive", "all"):
        result["naive"] = run_naive(args)
        print(ratio_table(result["naive"], "naive", "chunk speed-up"), flush=True)
    if args.part in ("minimal", "all"):
        result["minimal"] = run_minimal(args)
        print(ratio_table(result["minimal"], "minimal", "speed-up over ssd_minimal"), flush=True)
    if args.part in ("small", "all"):
        result["small"] = run_small(args)
        print(small_table(result["small"]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
