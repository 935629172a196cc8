"""How far memory reaches in evaluation: the bytes one sequence needs per position, per model, and
the longest sequence that fits a memory size (default 24 GiB, this machine's), at batch 1, as
``longrange evaluate --memory-budget`` reckons it (the counted need times its margin).

Usage: python benchmarks/eval_memory.py [--memory 24GiB] [--check-length 131072] [--json OUT]

For each model (2 layers, width 64 as in the Mamba paper's synthetic tasks; attention also at
width 128 with 8 heads) the need is measured as ``longrange evaluate`` measures it
(``longrange.train.memory``: tensor storages counted during forward passes at lengths 64, 128 and
256, a quadratic through them), then checked against the operating system's view: the growth of
the peak resident memory (``VmHWM``, reset before the pass) of a fresh process over one forward pass at ``--check-length`` (a
shorter length for attention, whose time grows with its square). The figures are in bytes and do
not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

MODELS = {
    "Simple-S6": dict(block="simple", primitive="s6", d_model=64),
    "Mamba-S6": dict(block="mamba", primitive="s6", d_model=64),
    "Simple-S4D": dict(block="simple", primitive="s4d", d_model=64, d_state=64),
    "Simple-DLR": dict(block="simple", primitive="dlr", d_model=64, d_state=64),
    "Transformer d64": dict(block="transformer", primitive="attention", d_model=64, n_heads=8),
    "Transformer d128": dict(block="transformer", primitive="attention", d_model=128, n_heads=8),
}
HEAD = {"input_kind": "tokens", "vocab_size": 21, "kind": "classify"}

CHILD = r"""
import json, sys, torch
from longrange.models.config import ModelConfig
from longrange.models.model import build_model


def status(key):  # kB -> bytes, from /proc/self/status (VmHWM: the peak resident memory of this process)
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024


settings, length = json.loads(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
cfg = ModelConfig(n_layers=2, direction="causal", **settings)
model = build_model(cfg, input_kind="tokens", head="classify", n_out=16, vocab_size=21).eval()
x = torch.randint(5, 21, (1, length))
with torch.no_grad():
    model(x[:, :256])  # kernels compiled and loaded, allocator warm
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident memory
    before = status("VmRSS")
    model(x)
print(json.dumps({"rss_growth": status("VmHWM") - before}))
"""


def measure(name: str, settings: dict, check_length: int) -> dict:
    import torch

    from longrange.models.config import ModelConfig
    from longrange.models.model import build_model
    from longrange.train.memory import forward_peak, measure_need

    torch.manual_seed(0)
    model = build_model(
        ModelConfig(n_layers=2, direction="causal", **settings),
        input_kind="tokens",
        head="classify",
        n_out=16,
        vocab_size=21,
    ).eval()
    need = measure_need(model, HEAD, 1 << 20)
    counted = forward_peak(model, HEAD, check_length)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(settings), str(check_length)],
        capture_output=True,
        text=True,
        check=True,
    )
    rss = json.loads(child.stdout.strip().splitlines()[-1])["rss_growth"]
    return {
        "model": name,
        "settings": settings,
        "bytes_per_position": need.b,
        "bytes_per_position_squared": need.c,
        "constant": need.a,
        "probes": need.measured,
        "check_length": check_length,
        "predicted_at_check": need.counted(check_length),
        "counted_at_check": counted,
        "rss_growth_at_check": rss,
    }


def longest(row: dict, memory: float) -> int:
    """The longest sequence whose counted need, times the budget's margin, fits ``memory``."""
    from longrange.train.memory import MARGIN

    memory /= MARGIN
    a, b, c = row["constant"], row["bytes_per_position"], row["bytes_per_position_squared"]
    if c > 0:
        return int((-b + (b * b + 4 * c * (memory - a)) ** 0.5) / (2 * c))
    return int((memory - a) / b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memory", default="24GiB", help="the memory to fill (default 24GiB)")
    parser.add_argument(
        "--check-length", type=int, default=1 << 17, help="length of the RSS check (attention: 1/8 of it)"
    )
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    from longrange.train.memory import format_bytes, parse_bytes

    memory = parse_bytes(args.memory)
    rows = []
    print(
        f"| model | counted bytes / position | longest sequence within {args.memory} (batch 1, margin included) | "
        "at the check length: predicted / counted / peak RSS growth (RSS / counted) |"
    )
    print("|---|---:|---:|---|")
    for name, settings in MODELS.items():
        length = args.check_length // 8 if settings["primitive"] == "attention" else args.check_length
        row = measure(name, settings, length)
        row["longest"] = longest(row, memory)
        rows.append(row)
        square = f" + {row['bytes_per_position_squared']:.3g} L²" if row["bytes_per_position_squared"] else ""
        print(
            f"| {name} | {row['bytes_per_position']:.0f}{square} | {row['longest']:,} (2^{row['longest'].bit_length() - 1}) | "
            f"{format_bytes(row['predicted_at_check'])} / {format_bytes(row['counted_at_check'])} / "
            f"{format_bytes(row['rss_growth_at_check'])} ({row['rss_growth_at_check'] / row['counted_at_check']:.2f}) "
            f"at {length:,} |",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"memory": memory, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
