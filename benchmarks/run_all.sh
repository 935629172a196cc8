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
# The SSM-kernel products (S4D, S4): every implementation side by side, one torch thread.
python benchmarks/ssm_kernels.py --threads 1 --json benchmarks/results/ssm_kernels.json | tee benchmarks/results/ssm_kernels.txt
# attention on a CPU: numba against PyTorch's kernel, the rule of "auto" (docs/small-models.md, "Fourteenth round")
python benchmarks/attention_cpu.py --json benchmarks/results/attention_cpu.json | tee benchmarks/results/attention_cpu.txt
# Accuracy of the SSM-kernel products on long kernels (CPU; Triton in its interpreter: about an hour).
python benchmarks/ssm_kernel_accuracy.py --impls numba --json benchmarks/results/ssm_kernel_accuracy_numba.json \
    | tee benchmarks/results/ssm_kernel_accuracy_numba.txt
python benchmarks/ssm_kernel_accuracy.py --cases cauchy --impls triton --L 2048 --json benchmarks/results/ssm_kernel_accuracy_triton_cauchy_2048.json \
    | tee benchmarks/results/ssm_kernel_accuracy_triton_cauchy_2048.txt
python benchmarks/ssm_kernel_accuracy.py --cases vandermonde,vandermonde-long --L 65536 --impls triton,triton-float64 \
    --json benchmarks/results/ssm_kernel_accuracy_triton_vandermonde.json | tee benchmarks/results/ssm_kernel_accuracy_triton_vandermonde.txt
# The S4, S4D and DLR rows with the chunked PyTorch products and the fused ones (auto: numba on CPU,
# Triton on CUDA), in turn, twice.
for round in 1 2; do
    for impl in chunked auto; do
        longrange bench --scaling --primitives s4 s4d dlr --ssm-kernel-impl "$impl" "$@" \
            --json "benchmarks/results/scaling_ssm_${impl}_$round.json" | tee "benchmarks/results/scaling_ssm_${impl}_$round.txt"
    done
done
# The memory of evaluation per model and how far 24 GiB reach (docs/inference.md); figures in bytes.
python benchmarks/eval_memory.py --json benchmarks/results/eval_memory.json | tee benchmarks/results/eval_memory.txt
