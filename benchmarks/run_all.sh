#!/usr/bin/env bash
# Re-measure every table and plot of docs/performance.md at the default settings.
# Usage: benchmarks/run_all.sh [extra options for every command, e.g. --device cuda]
# Writes the raw rows to benchmarks/results/*.json, the charts to docs/img/*.png and the printed
# tables to benchmarks/results/*.txt. Run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p benchmarks/results docs/img
longrange bench "$@" --json benchmarks/results/bench.json --plot docs/img/bench.png | tee benchmarks/results/bench.txt
longrange bench --scaling "$@" --json benchmarks/results/scaling.json --plot docs/img/scaling.png | tee benchmarks/results/scaling.txt
longrange bench --scaling --unit block --primitives s4d s6 --lengths 1024,2048,4096,8192 "$@" \
    --json benchmarks/results/scaling_block.json --plot docs/img/scaling_block.png | tee benchmarks/results/scaling_block.txt
longrange bench --generation "$@" --json benchmarks/results/generation.json --plot docs/img/generation.png | tee benchmarks/results/generation.txt
# The CPU scan comparison takes no device options.
python benchmarks/cpu_scan.py --json benchmarks/results/cpu_scan.json | tee benchmarks/results/cpu_scan.txt
