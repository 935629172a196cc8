"""Print the rows of a ``longrange bench --json`` file as a Markdown table (for docs/performance.md).

Usage: python benchmarks/to_markdown.py benchmarks/results/bench.json
"""

from __future__ import annotations

import json
import sys

from longrange.bench.cli import BENCH_COLUMNS, GENERATION_COLUMNS, SCALING_COLUMNS


def markdown(rows: list[dict], columns, key: str) -> str:
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r[key]} | failed: {r['error']} |" + " |" * (len(columns) - 2))
        else:
            lines.append("| " + " | ".join(fmt(r.get(k)) if k in r else "-" for k, _, fmt in columns) + " |")
    return "\n".join(lines)


def main(path: str) -> None:
    payload = json.loads(open(path).read())
    mode = payload["mode"]
    if mode == "bench":
        print(markdown(payload["rows"], BENCH_COLUMNS, "model"))
    elif mode == "scaling":
        print(markdown(payload["rows"], SCALING_COLUMNS, "primitive"))
        print()
        print("| primitive | exponent |\n|---|---|")
        for p, e in payload["exponents"].items():
            print(f"| {p} | {'-' if e is None else f'{e:.2f}'} |")
    else:
        print(markdown(payload["rows"], GENERATION_COLUMNS, "model"))
    if payload.get("command"):
        print(f"\n`{payload['command']}`")


if __name__ == "__main__":
    main(sys.argv[1])
