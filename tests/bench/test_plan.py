"""``longrange plan`` (``bench/plan.py``): predictions checked against measurement where one can
measure here, and against analytic counts.

* Memory: the peak a plan predicts for a CPU step (``target="cpu"``, the CPU's kernels, on fake
  tensors) is compared with the peak of the same step on real CPU tensors, measured from the
  profiler's allocation events (``measured_cpu_peak``: the allocator's own record, not the planner's
  tracker), for the demo models and the thesis' five architectures at three small sizes.
* FLOPs: the counts of attention, the selective scan and the S4 kernel (forward and backward) equal
  formulas written out here.
* The search: the largest batch fits and the next does not; the accumulation divides the batch.

No GPU figure is asserted: none can be measured here.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from longrange.bench import plan as P
from longrange.bench.gpus import GPU, GPUS, find_gpu
from longrange.bench.plan import flop_counter, measure_step, plan_stage
from longrange.cli import main as cli_main
from longrange.errors import ConfigError
from longrange.experiment.config import resolve
from longrange.experiment.dryrun import prepare_step
from longrange.ops.dataless import fake_mode


# ------------------------------------------------------------------------------------------------
# The GPU table
# ------------------------------------------------------------------------------------------------
def test_the_gpu_table_is_complete_with_its_sources():
    assert set(GPUS) == {"h100-sxm", "h100-pcie", "h200", "a100-40gb", "a100-80gb", "l4", "rtx-4090", "rtx-3090"}
    for gpu in GPUS.values():
        assert gpu.source and ("Datasheet" in gpu.source or "whitepaper" in gpu.source)
        assert 0 < gpu.fp32 <= gpu.tf32 <= gpu.bf16 and gpu.bandwidth > 1e11 and gpu.memory_gb >= 24
    assert GPUS["h100-sxm"].bf16 == 989.4e12 and GPUS["h100-sxm"].bandwidth == 3.35e12  # dense: half of 1979 (sparse)
    assert GPUS["h200"].memory_bytes == 141 * 2**30


def test_gpus_are_found_by_key_name_or_spelling_and_an_unknown_one_lists_them():
    assert find_gpu("H100 SXM") is find_gpu("h100_sxm") is find_gpu("NVIDIA H100 SXM 80GB") is GPUS["h100-sxm"]
    assert find_gpu("4090") is GPUS["rtx-4090"] and find_gpu("A100 80") is GPUS["a100-80gb"]
    assert find_gpu("NVIDIA H100 80GB HBM3") is GPUS["h100-sxm"]  # as torch.cuda.get_device_name() says
    assert find_gpu("NVIDIA A100-SXM4-40GB") is GPUS["a100-40gb"] and find_gpu("NVIDIA L4") is GPUS["l4"]
    with pytest.raises(
        ConfigError, match=r"unknown GPU 'v100'; known GPUs: h100-sxm \(NVIDIA H100 SXM 80GB\), .*rtx-3090"
    ):
        find_gpu("v100")


# ------------------------------------------------------------------------------------------------
# Memory: predicted (fake tensors) against measured (real CPU tensors, the profiler's events)
# ------------------------------------------------------------------------------------------------
#: The demo models and the thesis' five architectures (one task each, token and numeric inputs).
MODELS = {
    "demo/s4d": None,
    "demo/transformer": None,
    "demo/dlr": None,
    "thesis/scifar/mamba-s6": None,
    "thesis/image/mamba-s4d": None,
    "thesis/pathfinder/mamba-s4": None,
    "thesis/text/simple-s4": 116,
    "thesis/scifar/simple-s4d": None,
}
#: (layers, batch, length): small, so that the steps are fast (a fake step costs per operation, so
#: per layer); the models keep their widths, state sizes and blocks.
SIZES = [(1, 1, 32), (1, 3, 64), (1, 2, 256)]


@pytest.mark.parametrize("name", MODELS)
def test_predicted_peak_is_within_15_percent_of_the_measured_peak(name):
    for layers, batch, length in SIZES:
        overrides = [f"model.n_layers={layers}"]
        if resolve(name).model.primitive == "s4":
            overrides.append(f"model.primitive_options.l_max={length}")
        exp = resolve(name, overrides=overrides)
        predicted = measure_step(
            exp, micro_batch=batch, seq_len=length, target="cpu", vocab=MODELS[name], count=False
        ).peak
        measured = P.measured_cpu_peak(exp, micro_batch=batch, seq_len=length, vocab=MODELS[name])
        assert abs(predicted["total"] / measured - 1) < 0.15, (name, layers, batch, length, predicted, measured)
        assert predicted["total"] == sum(predicted[k] for k in ("params", "grads", "optimizer", "activations"))
        model = prepare_step(exp, device="meta", vocab=MODELS[name]).model
        params = list(model.parameters())
        size = sum(4 * p.numel() for p in params)  # float32
        assert predicted["params"] == size + sum(4 * b.numel() for b in model.buffers())
        assert (
            predicted["optimizer"] >= 2 * size
        )  # AdamW's two moments (and its temporaries if the peak is in its step)


# ------------------------------------------------------------------------------------------------
# FLOPs against analytic counts
# ------------------------------------------------------------------------------------------------
def test_attention_flops_are_four_b_h_l2_d_forward_and_ten_backward():
    """Two matrix products forward (Q K^T, then P V: 2 FLOPs per multiply-add), five backward (Q K^T
    again, dV, dP, dQ, dK), whichever kernel runs: the CUDA one a GPU plan models, or PyTorch's CPU one."""
    b, h, length, d = 2, 3, 256, 16
    expected = 4 * b * h * length**2 * d + 10 * b * h * length**2 * d
    for attention in (P.cuda_attention, F.scaled_dot_product_attention):
        with fake_mode():
            q, k, v = (torch.randn(b, h, length, d, requires_grad=True) for _ in range(3))
            with flop_counter() as counter:
                attention(q, k, v, is_causal=True).sum().backward()
        assert counter.get_total_flops() == expected, attention


def test_selective_scan_flops_follow_its_recurrence():
    """Per state element and position, forward: exp(delta A) 2, h = a h + (delta u) B 3, y += C h 2;
    per position: delta u 1, + D u 2, the gate y z sigma(z) 5. Backward: per state element 22 (the
    states again 5, the output with the gate 2, the adjoint and the gradients 15), per position 6,
    D 2, the gate 11."""
    from longrange.ops.scan import selective_scan

    b, d, length, n = 2, 8, 64, 4
    expected = b * d * length * (7 * n + 1 + 2 + 5) + b * d * length * (22 * n + 6 + 2 + 11)
    for impl in ("numba", "triton"):
        with fake_mode():
            u, z = torch.randn(b, d, length, requires_grad=True), torch.randn(b, d, length, requires_grad=True)
            delta, A, D = (
                torch.rand(b, d, length),
                -torch.rand(d, n, requires_grad=True),
                torch.ones(d, requires_grad=True),
            )
            B, C = torch.randn(b, n, length), torch.randn(b, n, length)
            with flop_counter() as counter:
                selective_scan(u, delta, A, B, C, D, z, impl=impl).sum().backward()
        assert counter.get_total_flops() == expected, impl


def test_s4_kernel_flops_are_its_cauchy_sums_and_inverse_fft():
    """The S4 kernel at length L: the four Woodbury Cauchy sums of J = 4 vectors (one output channel,
    rank 1) at K = L/2 + 1 roots of unity over N/2 conjugate pairs of poles per channel: forward, per
    (channel, root, pole) 18 for the two resolvents and their sums, per term 8; then an inverse real
    FFT of length L per channel, 2.5 L log2 L. Backward (the Triton kernels, two passes that each
    compute the resolvents, 32 per (channel, root, pole)): per term 16 (gradients of v and w) + 8
    (of z), per (vector, channel, pole) 8, per (vector, channel, root) 8; and the FFT's adjoint, a
    forward real FFT of length L."""
    from longrange.layers.s4 import S4
    from longrange.ops import ssm_kernels

    H, N, L = 6, 16, 64
    J, K, M = 4, L // 2 + 1, N // 2
    forward = H * K * M * 18 + 8 * J * H * K * M + H * 2.5 * L * math.log2(L)
    backward = (
        2 * H * K * M * 32
        + 16 * J * H * K * M
        + 8 * J * H * M
        + 8 * J * H * K * M
        + 8 * J * H * K
        + H * 2.5 * L * math.log2(L)
    )
    with fake_mode(), ssm_kernels.default_impl(ssm_kernels.OPS, "triton"):
        layer = S4(H, N, l_max=L)
        with flop_counter() as counter:
            layer.kernel(L).sum().backward()
    assert counter.get_total_flops() == round(forward) + round(backward)


def test_traffic_counts_operands_once_and_views_not_at_all():
    with fake_mode():
        a, b = torch.randn(8, 16), torch.randn(16, 4)
        with P.Traffic() as traffic:
            out = a @ b  # reads 8*16 + 16*4, writes 8*4 floats
            out.t().reshape(-1)  # a view then a copy: the copy reads and writes 32 floats
            a.expand(3, 8, 16).sum(0)  # a broadcast operand counts once
    assert traffic.totals("fwdbwd") == (2 * 8 * 16 * 4, 4 * (8 * 16 + 16 * 4 + 8 * 4) + 4 * 64 + 4 * (8 * 16 + 8 * 16))
    # the roofline per operation: the product at the float32 rate or its bytes, the others their bytes
    gpu = GPUS["h100-sxm"]
    matmul = max(2 * 8 * 16 * 4 / gpu.fp32, 4 * (8 * 16 + 16 * 4 + 8 * 4) / gpu.bandwidth)
    bound, compute = traffic.time_bound(gpu, "fwdbwd")
    assert bound == pytest.approx(matmul + (4 * 64 + 4 * 256) / gpu.bandwidth) and compute == pytest.approx(
        1024 / gpu.fp32
    )


# ------------------------------------------------------------------------------------------------
# The plan: the largest batch, accumulation, precision, the GPU's attention
# ------------------------------------------------------------------------------------------------
def tiny_gpu(megabytes: float) -> GPU:
    return GPU("tiny", "a tiny GPU", megabytes / 1024, 1e11, 1e12, 2e12, 4e12, "test")


def test_the_largest_batch_fits_and_the_next_does_not_and_accumulation_divides_the_batch(monkeypatch):
    monkeypatch.setattr(P, "RESERVED_BYTES", 0)
    monkeypatch.setattr(P, "FRAGMENTATION", 0.0)
    exp = resolve("demo/s4d")
    plan = plan_stage(exp, tiny_gpu(10), name="demo/s4d")  # batch 32 needs about 25 MiB
    usable = P.usable_bytes(plan.gpu)
    assert not plan.fits and plan.peak_bytes["total"] > usable
    peak = lambda m, n=1: measure_step(exp, micro_batch=m, micro_batches=n, count=False).peak["total"]  # noqa: E731
    assert 1 <= plan.max_batch < 32 and peak(plan.max_batch) <= usable < peak(plan.max_batch + 1)
    assert 32 % plan.accumulation == 0 and plan.micro_batch == 32 // plan.accumulation <= plan.max_batch
    assert plan.peak_bytes_accumulated["total"] <= usable and plan.peak_bytes_accumulated["grads"] > 0
    assert plan.peak_bytes_accumulated["total"] == peak(plan.micro_batch, 2)
    smaller = [a for a in range(2, plan.accumulation) if 32 % a == 0]
    assert all(peak(32 // a, 2) > usable for a in smaller)
    # per step: the accumulated micro-batches' FLOPs and one optimiser step
    one = measure_step(exp, micro_batch=plan.micro_batch, gpu=plan.gpu)
    assert plan.flops_per_step == plan.accumulation * one.flops["fwdbwd"] + one.flops["optimizer"]


def test_nothing_fits_on_a_gpu_too_small_for_one_sequence(monkeypatch):
    monkeypatch.setattr(P, "RESERVED_BYTES", 0)
    plan = plan_stage(resolve("demo/s4d"), tiny_gpu(0.5), batch=4)
    assert (plan.fits, plan.max_batch, plan.accumulation) == (False, 0, None)


def test_bf16_autocast_halves_the_matrix_products_activations_and_runs_them_on_tensor_cores():
    fp32 = measure_step(resolve("demo/transformer"), micro_batch=8, gpu=GPUS["h100-sxm"])
    bf16 = measure_step(
        resolve("demo/transformer", overrides=["train.precision=bf16"]), micro_batch=8, gpu=GPUS["h100-sxm"]
    )
    assert bf16.peak["activations"] < fp32.peak["activations"]
    assert bf16.peak["params"] == fp32.peak["params"] and bf16.flops["fwdbwd"] == fp32.flops["fwdbwd"]
    assert bf16.time["fwdbwd_compute"] < fp32.time["fwdbwd_compute"]


def test_a_gpu_plan_models_attention_without_its_length_squared_matrix():
    """PyTorch's CPU attention with dropout keeps the (L, L) probabilities; CUDA's kernels do not."""
    exp = resolve("demo/transformer", overrides=["model.attn_dropout=0.1"])
    gpu = measure_step(exp, micro_batch=2, seq_len=1024, target="gpu", count=False).peak["activations"]
    cpu = measure_step(exp, micro_batch=2, seq_len=1024, target="cpu", count=False).peak["activations"]
    layers, heads = exp.model.n_layers, exp.model.n_heads
    assert cpu - gpu > layers * 2 * heads * 1024**2 * 4  # at least one float32 (L, L) matrix per head and layer


def test_a_plan_runs_the_targets_convolution():
    """A CPU step convolves the demo's 24 positions by one matrix product, a CUDA step by FFT (what
    ``impl="auto"`` runs on each device), and each plan models and records that one."""
    exp = resolve("demo/recall/dlr")
    gpu = measure_step(exp, micro_batch=2, seq_len=24, target="gpu", count=False)
    cpu = measure_step(exp, micro_batch=2, seq_len=24, target="cpu", count=False)
    assert gpu.kernels["fft_conv"] == "fft" and cpu.kernels["fft_conv"] == "direct"


def test_a_gpu_plan_runs_pytorchs_short_convolution_and_norm_which_keep_more(monkeypatch):
    """On a GPU (without causal-conv1d) the Mamba block's convolution is PyTorch's ``conv1d`` and the
    output norm and SwiGLU their formulas, which keep more for the backward than the CPU's numba kernels: planned
    with the numba kernels, Mamba-S6 on sCIFAR measured 1.30x its predicted peak on an H200."""
    from contextlib import nullcontext

    from longrange.ops import conv, glu, norm

    exp = resolve("demo/recall/mamba2")  # a Mamba block's convolution and Mamba-2's gated norm
    gpu = measure_step(exp, micro_batch=2, seq_len=64, target="gpu", count=False)
    cpu = measure_step(exp, micro_batch=2, seq_len=64, target="cpu", count=False)
    assert gpu.kernels["causal_conv1d"] == "torch" and cpu.kernels["causal_conv1d"] == "numba"
    assert gpu.kernels["rms_norm"] == "torch" and cpu.kernels["rms_norm"] == "numba"
    assert gpu.kernels["ssd"] == "chunk" and cpu.kernels["ssd"] == "numba"
    gla = resolve("demo/recall/gla")  # FLA's stack: GLA and a SwiGLU MLP
    gpu_gla, cpu_gla = (measure_step(gla, micro_batch=2, seq_len=64, target=t, count=False) for t in ("gpu", "cpu"))
    assert gpu_gla.kernels["swiglu"] == "torch" and cpu_gla.kernels["swiglu"] == "numba"
    assert gpu_gla.kernels["gla"] == "chunk" and cpu_gla.kernels["gla"] == "numba"
    deltanet = resolve("demo/recall/deltanet")  # heads of 16 x 16: the numba kernels on CPUs
    gpu_dn, cpu_dn = (measure_step(deltanet, micro_batch=2, seq_len=64, target=t, count=False) for t in ("gpu", "cpu"))
    assert gpu_dn.kernels["delta_rule"] == "chunk" and cpu_dn.kernels["delta_rule"] == "numba"
    for op in (conv, norm, glu):  # the plan as it was: the numba kernels' fake implementations
        monkeypatch.setattr(op, "default_impl", lambda impl: nullcontext())
    before = measure_step(exp, micro_batch=2, seq_len=64, target="gpu", count=False)
    assert before.kernels["causal_conv1d"] == "numba"
    assert gpu.peak["activations"] > before.peak["activations"]
    before_gla = measure_step(gla, micro_batch=2, seq_len=64, target="gpu", count=False)
    assert before_gla.kernels["swiglu"] == "numba" and gpu_gla.peak["activations"] > before_gla.peak["activations"]


# ------------------------------------------------------------------------------------------------
# The command
# ------------------------------------------------------------------------------------------------
def test_plan_command_writes_the_json_the_gpu_session_reads(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert cli_main(["plan", "demo/transformer", "--gpu", "l4", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    for key in (
        "preset",
        "gpu",
        "batch",
        "params",
        "peak_bytes",
        "flops_per_step",
        "bytes_per_step",
        "max_batch",
        "accumulation",
        "step_time_lower_bound_s",
    ):
        assert key in data, key
    assert (data["preset"], data["gpu"], data["batch"], data["accumulation"]) == ("demo/transformer", "l4", 32, 1)
    assert set(data["peak_bytes"]) == {"total", "params", "grads", "optimizer", "activations"}
    assert data["params"] == 102026 and data["max_batch"] > 32 and data["step_time_lower_bound_s"] > 0
    assert data["peak_bytes"]["total"] <= data["usable_bytes"] == P.usable_bytes(GPUS["l4"])
    text = capsys.readouterr().out
    assert "predicted, not measured" in text and "NVIDIA L4 24GB" in text
    assert (
        "GPU rates        300 GB/s; FP32 30.3 TFLOP/s, TF32 tensor 60 TFLOP/s, BF16 tensor 121 TFLOP/s "
        "(source: NVIDIA L4 Tensor Core GPU Datasheet" in text
    )  # the figures the bound uses, with their source


def test_the_plan_says_the_runs_total_time_from_its_steps(capsys):
    """steps x the step's bound: train.max_steps; else epochs x items // batch, the items a generated
    task's n_train after train_subset, or given (--items) for data read from files."""
    recall = resolve("demo/recall/dlr")
    assert P.planned_steps(recall) == (1000, "train.max_steps")
    by_epochs = resolve("demo/recall/dlr", overrides=["train.max_steps=0", "train.epochs=3", "task.train_subset=1000"])
    assert P.planned_steps(by_epochs) == (3 * (1000 // 32), "3 epochs x 31 steps (task.train_subset 1000, batch 32)")
    files = resolve("demo/s4d")  # ListOps epochs over a training set not counted here
    steps, how = P.planned_steps(files)
    assert steps is None and "--items N" in how
    cfg = files.train_config("train")
    assert P.planned_steps(files, items=800)[0] == cfg.epochs * (800 // cfg.batch_size)
    plan = plan_stage(recall, find_gpu("l4"), find_max_batch=False)
    assert plan.steps == 1000 and plan.run_time_lower_bound_s == pytest.approx(1000 * plan.step_time_lower_bound_s)
    assert cli_main(["plan", "demo/recall/dlr", "--gpu", "l4"]) == 0
    assert "  run time         >= " in capsys.readouterr().out
    assert cli_main(["plan", "demo/s4d", "--gpu", "l4"]) == 0
    assert "  run time         not counted: 30 epochs of a training set whose size" in capsys.readouterr().out


def test_plan_command_takes_a_yaml_file_and_overrides_as_params_does(tmp_path, capsys):
    path = tmp_path / "mine.yaml"
    path.write_text("base: demo/transformer\nlabel: mine\ntrain: {batch_size: 8}\n")
    out = tmp_path / "plan.json"
    assert cli_main(["plan", str(path), "model.d_model=32", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["batch"] == 8 and data["gpu"] == "h100-sxm"
    assert cli_main(["params", "--preset", str(path), "model.d_model=32"]) == 0
    assert f"{data['params'] / 1000:.1f}k" in capsys.readouterr().out


def test_plan_command_errors(tmp_path, capsys, monkeypatch):
    assert cli_main(["plan", "demo/s4d", "--gpu", "v100"]) == 1
    assert "unknown GPU 'v100'; known GPUs: h100-sxm" in capsys.readouterr().err
    monkeypatch.setattr(P, "RESERVED_BYTES", 0)
    monkeypatch.setitem(GPUS, "tiny", tiny_gpu(10))
    out = tmp_path / "plan.json"
    assert cli_main(["plan", "demo/s4d", "--gpu", "tiny", "--json", str(out)]) == 0  # the preset's batch: accumulated
    assert "does not fit in one step" in capsys.readouterr().err and json.loads(out.read_text())["accumulation"] > 1
    assert cli_main(["plan", "demo/s4d", "--gpu", "tiny", "--batch", "64", "--json", str(out)]) == 1
    err = capsys.readouterr().err
    assert "error: demo/s4d at batch 64 on a tiny GPU does not fit in one step" in err
    assert "train.grad_accum=" in err and json.loads(out.read_text())["fits"] is False
    assert cli_main(["plan", "demo/s4d", "--stage", "train", "--objective", "masked"]) == 1
    assert "objective 'masked' is for pretraining" in capsys.readouterr().err
