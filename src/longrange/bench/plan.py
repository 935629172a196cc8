"""Planning a training run on a GPU without one (``longrange plan``): the memory of a training step
and its parts, FLOPs and bytes moved, the largest batch that fits, the gradient accumulation the
published batch needs, and a lower bound of the step time.

    plan = plan_stage(resolve("spt/path-x/s4"), find_gpu("h100-sxm"))
    plan.peak_bytes["total"], plan.fits, plan.max_batch, plan.accumulation, plan.step_time_lower_bound_s

Every figure is **predicted, not measured**. How:

* **The step.** The stage's training step as ``experiment/dryrun.py`` builds it (its model, objective,
  AdamW over the trainer's parameter groups, a synthetic batch at the task's full length) runs on
  fake CPU tensors under ``FakeTensorMode`` (:func:`longrange.ops.dataless.fake_mode`): shapes,
  dtypes and the operations a run performs, no values and no memory. The optimiser's state exists
  before the measured step (a step of the steady state, not the first).
* **Memory**: ``torch.distributed._tools.mem_tracker.MemTracker`` follows every tensor storage as it
  is created and freed and keeps the peak, by kind: parameters (and buffers), gradients, optimiser
  state, and activations (everything else: saved activations, temporaries, the batch).
* **FLOPs**: ``torch.utils.flop_counter.FlopCounterMode`` with PyTorch's formulas (matrix products,
  convolutions, attention), the fused kernels' own (``ops/custom_ops.py``) and two added here
  (:data:`EXTRA_FLOPS`: FFTs at 2.5 N log2 N per real transform and 5 N log2 N per complex one, and
  PyTorch's CPU flash attention, counted as its CUDA kernels are). Elementwise operations count no
  FLOPs (PyTorch's convention): their cost is the memory they move.
* **Bytes moved**: every operation reads its inputs and writes its outputs once (eager PyTorch moves
  each operand through memory; views move nothing; a gather reads no more of its source than it
  writes): :class:`Traffic`.
* **Step time lower bound**: each operation takes at least its FLOPs at the GPU's peak rate for its
  kind and dtype, and at least its bytes at the GPU's memory bandwidth; the bound is the sum over
  operations of the larger of the two (a roofline per operation). Rates (:mod:`longrange.bench.gpus`):
  bfloat16/float16 matrix products and attention at the tensor cores' dense rate; float32
  convolutions at TF32 (cuDNN's default); float32 matrix products and attention, the fused kernels,
  FFTs and everything else at the float32 rate of the CUDA cores (PyTorch's default
  ``allow_tf32 = False`` for matrix products). No launch latency, no overlap lost, no cache reuse
  across operations: real steps are slower.
* **The GPU's kernels** (``target="gpu"``, the default) where they differ from the CPU's: attention
  runs CUDA's flash kernel (bfloat16/float16 without a mask) or memory-efficient kernel (otherwise),
  which keep no (L, L) matrix, dropout included (PyTorch's CPU attention with dropout does); AdamW
  takes its multi-tensor path (PyTorch's default on CUDA). Autocast is CPU autocast (bf16; fp16 as
  float16 autocast without its gradient scaler), whose casting lists are close to CUDA's. The fused
  scan and SSM kernels are the CPU operators' fake implementations: the Triton scan keeps in addition
  the state at every 32nd position, (batch, channels, L/32, state) float32 per S6 layer, not counted.
  Long convolutions run by FFT at every length (on a CPU ``"auto"`` convolves short inputs by one
  matrix product instead: :mod:`longrange.ops.fftconv`). The Mamba block's short convolution is
  PyTorch's grouped ``conv1d`` and the matrix-state layers' output norm its formula, as on a GPU
  without causal-conv1d (whose kernel, where installed, keeps less: the plan is then high): the CPU's
  numba kernels keep only their inputs, and planning with them predicted 1.30x too little for
  ``thesis/scifar/mamba-s6`` on an H200 (3.03 GiB against 3.94 measured; 3.71 with ``conv1d``).
* **Fits**: the peak against the GPU's memory less :data:`RESERVED_BYTES` (CUDA context, cuBLAS and
  cuDNN workspaces) and :data:`FRAGMENTATION` of it (the caching allocator's rounding and
  fragmentation). The largest batch and the accumulation are searched by further fake steps (a
  line through two batch sizes, then checked), a micro-batch of accumulated steps with the gradients
  held between micro-batches.

What is not known without data is taken as the dry run takes it (``experiment/dryrun.py``): every
sequence at full length, and a selection by value (masked positions, answer positions) selecting
every position, an upper bound for the loss of masked pretraining.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from longrange.bench.gpus import GPU
from longrange.errors import ConfigError

aten = torch.ops.aten

#: Memory kept free on the GPU: the CUDA context and the workspaces of cuBLAS and cuDNN.
RESERVED_BYTES = 2**30
#: Share of the GPU's memory kept free for the caching allocator's rounding and fragmentation.
FRAGMENTATION = 0.05
#: The targets whose kernels a plan models.
TARGETS = ("gpu", "cpu")


def usable_bytes(gpu: GPU) -> int:
    """The memory a training step may take on ``gpu`` (see :data:`RESERVED_BYTES`, :data:`FRAGMENTATION`)."""
    return int(gpu.memory_bytes * (1 - FRAGMENTATION) - RESERVED_BYTES)


# ------------------------------------------------------------------------------------------------
# FLOPs PyTorch's counter has no formula for
# ------------------------------------------------------------------------------------------------
def _fft_flops(signal: int, batch: int, real: bool) -> int:
    if signal <= 1:
        return 0
    per = (2.5 if real else 5.0) * signal * math.log2(signal)
    return int(round(batch * per))


def _fft_dims(shape, dim) -> tuple[int, int]:
    signal = math.prod(shape[d] for d in dim)
    return signal, math.prod(shape) // max(signal, 1)


def _r2c_flops(self_shape, dim, normalization, onesided, out_shape=None, **kwargs) -> int:
    signal, batch = _fft_dims(self_shape, dim)
    return _fft_flops(signal, batch, real=True)


def _c2r_flops(self_shape, dim, normalization, last_dim_size, out_shape=None, **kwargs) -> int:
    signal, batch = _fft_dims(out_shape, dim)
    return _fft_flops(signal, batch, real=True)


def _c2c_flops(self_shape, dim, normalization, forward, out_shape=None, **kwargs) -> int:
    signal, batch = _fft_dims(self_shape, dim)
    return _fft_flops(signal, batch, real=False)


def _cpu_attention_flops(q, k, v, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(q, k, v)


def _cpu_attention_backward_flops(grad_out, q, k, v, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(grad_out, q, k, v)


#: FLOP formulas added to PyTorch's (``FlopCounterMode(custom_mapping=...)``): FFTs, and the CPU flash
#: attention kernel with the formula of the CUDA attention kernels.
EXTRA_FLOPS = {
    aten._fft_r2c: _r2c_flops,
    aten._fft_c2r: _c2r_flops,
    aten._fft_c2c: _c2c_flops,
    aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_attention_backward_flops,
}


def flop_registry() -> dict:
    """PyTorch's FLOP formulas with :data:`EXTRA_FLOPS` (each taking the operation's arguments)."""
    from torch.utils.flop_counter import flop_registry as registry
    from torch.utils.flop_counter import shape_wrapper

    return {**registry, **{op: shape_wrapper(f) for op, f in EXTRA_FLOPS.items()}}


def flop_counter() -> Any:
    """``FlopCounterMode`` counting with :func:`flop_registry`."""
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False, custom_mapping=dict(EXTRA_FLOPS))


# ------------------------------------------------------------------------------------------------
# Bytes moved, and the roofline of each operation
# ------------------------------------------------------------------------------------------------
#: Operations whose first input is read only where the output says (gathers).
_GATHERS = {
    aten.embedding.default,
    aten.index_select.default,
    aten.gather.default,
    aten.index.Tensor,
    aten._unsafe_index.Tensor,
}
#: Matrix-product-like operations (tensor cores in bf16/fp16; TF32 for float32 convolutions).
_MATRIX = {
    aten.mm,
    aten.addmm,
    aten.bmm,
    aten.baddbmm,
    aten.convolution,
    aten.convolution_backward,
    aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_flash_attention_backward,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_efficient_attention_backward,
    aten._scaled_dot_product_cudnn_attention,
    aten._scaled_dot_product_cudnn_attention_backward,
    aten._flash_attention_forward,
    aten._flash_attention_backward,
    aten._efficient_attention_forward,
    aten._efficient_attention_backward,
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention_for_cpu_backward,
}
_CONVOLUTIONS = {aten.convolution, aten.convolution_backward}
#: Operations that move no data: allocations without writing, and views the schema does not mark.
_NO_TRAFFIC = {
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
    aten.empty_like.default,
    aten._unsafe_view.default,
    aten.lift_fresh.default,
}


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of the elements ``t`` addresses (a broadcast dimension, of stride 0, counts once)."""
    repeated = math.prod(s for s, st in zip(t.shape, t.stride()) if st == 0 and s > 1)
    return t.numel() // max(repeated, 1) * t.element_size()


def _rate_class(packet: Any, tensors: list[torch.Tensor]) -> str:
    """``bf16`` (tensor cores, half precision), ``tf32`` (float32 convolutions) or ``fp32``."""
    dtype = next((t.dtype for t in tensors if t.is_floating_point()), torch.float32)
    if packet in _MATRIX and dtype in (torch.bfloat16, torch.float16):
        return "bf16"
    if packet in _CONVOLUTIONS and dtype == torch.float32:
        return "tf32"
    return "fp32"


class Traffic(TorchDispatchMode):
    """Counts, per operation, the bytes it reads and writes and its FLOPs (:func:`flop_registry`),
    with the phase it ran in (``fwdbwd`` or ``optimizer``, set by the caller) and its rate class."""

    def __init__(self) -> None:
        super().__init__()
        self.registry = flop_registry()
        self.phase = "fwdbwd"
        self.ops: list[tuple[str, str, int, int]] = []  # (phase, rate class, flops, bytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.is_view or func in _NO_TRAFFIC or func.namespace == "prim":
            return out
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        written = sum(tensor_bytes(t) for t in outputs)
        read = sum(tensor_bytes(t) for t in inputs)
        if func in _GATHERS and inputs:
            read += min(tensor_bytes(inputs[0]), written) - tensor_bytes(inputs[0])
        packet = func._overloadpacket
        flops = int(self.registry[packet](*args, **kwargs, out_val=out)) if packet in self.registry else 0
        self.ops.append((self.phase, _rate_class(packet, inputs), flops, read + written))
        return out

    def totals(self, phase: str) -> tuple[int, int]:
        """(FLOPs, bytes) of the operations of ``phase``."""
        ops = [op for op in self.ops if op[0] == phase]
        return sum(op[2] for op in ops), sum(op[3] for op in ops)

    def time_bound(self, gpu: GPU, phase: str) -> tuple[float, float]:
        """(the sum over the operations of ``phase`` of max(FLOPs / peak rate, bytes / bandwidth), the
        sum of their FLOPs / peak rate alone), in seconds."""
        rates = {"bf16": gpu.bf16, "tf32": gpu.tf32, "fp32": gpu.fp32}
        ops = [(flops / rates[rate], nbytes / gpu.bandwidth) for p, rate, flops, nbytes in self.ops if p == phase]
        return sum(max(c, m) for c, m in ops), sum(c for c, _ in ops)


# ------------------------------------------------------------------------------------------------
# The GPU's kernels
# ------------------------------------------------------------------------------------------------
def cuda_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """``scaled_dot_product_attention`` by the CUDA kernel PyTorch would choose: flash attention for
    bfloat16/float16 without a mask, else the memory-efficient kernel (a boolean mask becomes its
    additive bias, broadcast, as PyTorch passes it)."""
    if enable_gqa:
        raise ConfigError("planning attention with enable_gqa is not supported")
    if attn_mask is None and query.dtype in (torch.bfloat16, torch.float16):
        return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False, scale=scale)[0]
    bias = attn_mask
    if bias is not None and bias.dtype == torch.bool:
        bias = torch.zeros(bias.shape, dtype=query.dtype, device=query.device).masked_fill(~bias, float("-inf"))
    if bias is not None:
        bias = bias.expand(*query.shape[:-2], query.shape[-2], key.shape[-2])
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    return aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, needs_grad, dropout_p, is_causal, scale=scale
    )[0]


class CudaAttention(TorchFunctionMode):
    """Routes ``F.scaled_dot_product_attention`` to :func:`cuda_attention`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.scaled_dot_product_attention:
            return cuda_attention(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


class _AutocastOnly:
    """A precision that autocasts to ``dtype`` on the CPU, with a plain backward and step (fp16 on a
    GPU plan: its gradient scaler multiplies the loss and the gradients in place, no memory)."""

    def __init__(self, dtype: torch.dtype | None):
        self.dtype = dtype

    def autocast(self):
        from contextlib import nullcontext

        return nullcontext() if self.dtype is None else torch.autocast("cpu", dtype=self.dtype)

    def backward(self, loss):
        loss.backward()

    def step(self, optimizer, parameters, grad_clip: float = 0.0):
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(parameters, grad_clip)
        optimizer.step()


_AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


# ------------------------------------------------------------------------------------------------
# One step, measured on fake tensors
# ------------------------------------------------------------------------------------------------
@dataclass
class StepMeasure:
    """What a training step of ``micro_batches`` micro-batches of ``micro_batch`` sequences uses."""

    micro_batch: int
    micro_batches: int
    peak: dict[str, int]  # total, params, grads, optimizer, activations (bytes at the peak)
    parameters: int
    flops: dict[str, int]  # fwdbwd (all micro-batches), optimizer, counter (FlopCounterMode's total)
    bytes: dict[str, int]  # fwdbwd, optimizer
    time: dict[str, float] = field(default_factory=dict)  # fwdbwd, optimizer (s): the roofline bound
    seq_len: int = 0
    inputs: str = ""
    kernels: dict[str, str] = field(default_factory=dict)


def _peak_parts(snapshot: dict) -> dict[str, int]:
    from torch.distributed._tools.mem_tracker import _MemRefType

    get = lambda *kinds: int(sum(snapshot.get(k, 0) for k in kinds))  # noqa: E731
    parts = {
        "params": get(_MemRefType.PARAM, _MemRefType.BUFFER),
        "grads": get(_MemRefType.GRAD),
        "optimizer": get(_MemRefType.OPT),
        "activations": get(_MemRefType.ACT, _MemRefType.TEMP, _MemRefType.OTH),
    }
    return {"total": int(snapshot.get("Total", sum(parts.values()))), **parts}


@contextmanager
def _phase(traffic: Traffic, optimizer: torch.optim.Optimizer) -> Iterator[None]:
    pre = optimizer.register_step_pre_hook(lambda *a: setattr(traffic, "phase", "optimizer"))
    post = optimizer.register_step_post_hook(lambda *a: setattr(traffic, "phase", "fwdbwd"))
    try:
        yield
    finally:
        pre.remove()
        post.remove()


def measure_step(
    exp,
    stage: str = "train",
    objective: str | None = None,
    *,
    micro_batch: int,
    micro_batches: int = 1,
    target: str = "gpu",
    gpu: GPU | None = None,
    vocab: int | None = None,
    seq_len: int | None = None,
    count: bool = True,
) -> StepMeasure:
    """One training step of ``micro_batches`` micro-batches of ``micro_batch`` sequences of ``exp``'s
    ``stage`` on fake CPU tensors (see the module docstring): its peak memory by kind, FLOPs and bytes
    by phase (``count=False``: memory only, faster) and, for ``gpu``, the roofline bound of each phase."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from longrange.experiment.dryrun import prepare_step
    from longrange.ops import used
    from longrange.ops.dataless import DtypeChecks, fake_mode

    if target not in TARGETS:
        raise ConfigError(f"unknown plan target {target!r}; expected one of {', '.join(TARGETS)}")
    precision_name = exp.train_config(stage).precision
    precision = _AutocastOnly(_AUTOCAST[precision_name]) if target == "gpu" else None
    with ExitStack() as stack:
        stack.enter_context(fake_mode())
        stack.enter_context(DtypeChecks())
        if target == "gpu":  # the GPU's attention kernels and fused Triton kernels (their fake implementations)
            from longrange.ops import conv, fftconv, glu, norm, scan, ssm_kernels
            from longrange.ops.matrix_state.dispatch import DISPATCHERS as MATRIX_STATE

            stack.enter_context(CudaAttention())
            stack.enter_context(scan.default_impl("triton"))
            stack.enter_context(ssm_kernels.default_impl(ssm_kernels.OPS, "triton"))
            stack.enter_context(fftconv.default_impl("fft"))  # "auto" on CUDA: the FFT at every length
            # PyTorch's ops where a GPU has no fused kernel of ours: the norm's and SwiGLU's formulas,
            # the convolution's grouped conv1d (causal-conv1d's kernel, where installed, keeps less),
            # the matrix-state recurrences' chunked forms (mamba-ssm's and flash-linear-attention's
            # kernels, where installed, differ)
            stack.enter_context(conv.default_impl("torch"))
            stack.enter_context(norm.default_impl("torch"))
            stack.enter_context(glu.default_impl("torch"))
            for op in ("ssd", "gla", "delta_rule", "gated_delta_rule"):
                stack.enter_context(MATRIX_STATE[op].default_impl("chunk"))
        prepared = prepare_step(
            exp,
            stage,
            objective,
            device="cpu",
            batch_size=micro_batch * micro_batches,
            grad_accum=micro_batches,
            seq_len=seq_len,
            vocab=vocab,
            precision=precision,
        )
        model, optimizer = prepared.model, prepared.optimizer
        if target == "gpu":  # AdamW's multi-tensor path, PyTorch's default on CUDA
            for group in optimizer.param_groups:
                group["foreach"] = True
        for p in model.parameters():  # the optimiser's state, as after the first step
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tracker = MemTracker()
        tracker.track_external(model, optimizer, *[t for b in prepared.batches for t in b.values()])
        traffic, flops = Traffic(), flop_counter()
        used.reset()
        with ExitStack() as counting:
            counting.enter_context(tracker)
            if count:
                for mode in (flops, traffic, _phase(traffic, optimizer)):
                    counting.enter_context(mode)
            prepared.step(lambda i: tracker.reset_mod_stats() if i else None)  # MemTracker: one forward per module
        snapshot = tracker.get_tracker_snapshot("peak")
    peak = _peak_parts(next(iter(snapshot.values()), {}))
    (f_fb, b_fb), (f_opt, b_opt) = traffic.totals("fwdbwd"), traffic.totals("optimizer")
    first = prepared.batches[0]["inputs"]
    measure = StepMeasure(
        micro_batch,
        micro_batches,
        peak,
        sum(p.numel() for p in model.parameters()),
        {"fwdbwd": f_fb, "optimizer": f_opt, "counter": int(flops.get_total_flops())},
        {"fwdbwd": b_fb, "optimizer": b_opt},
        seq_len=prepared.seq_len,
        inputs=f"{str(first.dtype).removeprefix('torch.')} {tuple(first.shape)}",
        kernels=dict(used.kernels()),
    )
    if gpu is not None:
        for phase in ("fwdbwd", "optimizer"):
            measure.time[phase], measure.time[phase + "_compute"] = traffic.time_bound(gpu, phase)
    return measure


def measured_cpu_peak(
    exp,
    stage: str = "train",
    objective: str | None = None,
    *,
    micro_batch: int,
    seq_len: int | None = None,
    vocab: int | None = None,
) -> int:
    """The peak bytes of live tensors during one real training step on the CPU, measured: the tensors
    alive before it (parameters, buffers, optimiser state as after a first step, the batch) plus the
    largest running sum of the allocations and frees that PyTorch's profiler records during it (the
    allocator's own events). What :func:`measure_step` with ``target="cpu"`` predicts."""
    from torch.profiler import ProfilerActivity, profile

    from longrange.experiment.dryrun import prepare_step

    torch.manual_seed(0)
    prepared = prepare_step(
        exp, stage, objective, device="cpu", batch_size=micro_batch, grad_accum=1, seq_len=seq_len, vocab=vocab
    )
    for p in prepared.model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    prepared.optimizer.step()
    prepared.optimizer.zero_grad(set_to_none=True)
    state = [v for s in prepared.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    alive = [*prepared.model.parameters(), *prepared.model.buffers(), *state, *prepared.batches[0].values()]
    before = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in alive}.values())
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        prepared.step()
    events = sorted(
        (
            e
            for e in prof.profiler.kineto_results.events()
            if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
        ),
        key=lambda e: e.start_ns(),
    )
    running = peak = 0
    for e in events:
        running += e.nbytes()
        peak = max(peak, running)
    return before + peak


# ------------------------------------------------------------------------------------------------
# The plan
# ------------------------------------------------------------------------------------------------
@dataclass
class StepPlan:
    """A stage's training step planned for a GPU (every figure predicted, not measured)."""

    preset: str
    stage: str
    objective: str
    gpu: GPU
    precision: str
    batch: int  # the global batch planned for
    seq_len: int
    inputs: str
    params: int
    micro_batch: int  # of the accumulation chosen (batch / accumulation)
    accumulation: int | None  # None: not even a micro-batch of 1 fits
    fits: bool  # the whole batch in one step, without accumulation
    peak_bytes: dict[str, int]  # at the batch without accumulation
    peak_bytes_accumulated: dict[str, int] | None  # at the micro-batch of the accumulation (if > 1)
    max_batch: int | None  # the largest batch that fits without accumulation (0: none; None: not searched)
    usable_bytes: int
    flops_per_step: int
    bytes_per_step: int
    step_time_lower_bound_s: float
    compute_time_s: float  # the FLOPs alone at the peak rates (a bound too)
    memory_time_s: float  # the bytes alone at the bandwidth
    kernels: dict[str, str] = field(default_factory=dict)
    steps: int | None = None  # the stage's optimiser steps (None: they depend on uncounted data)
    steps_how: str = ""  # how they were counted

    @property
    def run_time_lower_bound_s(self) -> float | None:
        """The stage's steps times the step time's lower bound (evaluation not included)."""
        return None if self.steps is None else self.steps * self.step_time_lower_bound_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "stage": self.stage,
            "objective": self.objective,
            "gpu": self.gpu.key,
            "gpu_spec": self.gpu.to_dict(),
            "precision": self.precision,
            "batch": self.batch,
            "seq_len": self.seq_len,
            "inputs": self.inputs,
            "params": self.params,
            "peak_bytes": self.peak_bytes,
            "peak_bytes_accumulated": self.peak_bytes_accumulated,
            "usable_bytes": self.usable_bytes,
            "fits": self.fits,
            "max_batch": self.max_batch,
            "accumulation": self.accumulation,
            "micro_batch": self.micro_batch,
            "flops_per_step": self.flops_per_step,
            "bytes_per_step": self.bytes_per_step,
            "step_time_lower_bound_s": self.step_time_lower_bound_s,
            "compute_time_s": self.compute_time_s,
            "memory_time_s": self.memory_time_s,
            "kernels": self.kernels,
            "steps": self.steps,
            "steps_how": self.steps_how,
            "run_time_lower_bound_s": self.run_time_lower_bound_s,
            "predicted": True,
            "assumptions": {
                "reserved_bytes": RESERVED_BYTES,
                "fragmentation": FRAGMENTATION,
                "method": "longrange.bench.plan (docs/performance.md, planning a GPU run)",
            },
        }


class _Search:
    """Fake steps by micro-batch (and whether gradients are held from an earlier micro-batch), each taken once."""

    def __init__(self, exp, stage, objective, gpu: GPU, vocab, seq_len):
        self.args = (exp, stage, objective)
        self.kwargs = dict(gpu=gpu, vocab=vocab, seq_len=seq_len)
        self.done: dict[tuple[int, int], StepMeasure] = {}

    def __call__(self, micro_batch: int, accumulated: bool = False) -> StepMeasure:
        key = (micro_batch, 2 if accumulated else 1)
        if key not in self.done:
            self.done[key] = measure_step(*self.args, micro_batch=micro_batch, micro_batches=key[1], **self.kwargs)
        return self.done[key]

    def line(self) -> tuple[float, float] | None:
        """Intercept and slope of the peak against the micro-batch (one micro-batch per step), through
        the two largest steps taken (None with fewer than two)."""
        pts = sorted((m, s.peak["total"]) for (m, n), s in self.done.items() if n == 1)
        if len(pts) < 2:
            return None
        (m1, p1), (m2, p2) = pts[-2], pts[-1]
        slope = (p2 - p1) / (m2 - m1)
        return p2 - slope * m2, slope


#: The largest batch a plan looks for.
BATCH_LIMIT = 1 << 20


def _max_batch(search: _Search, usable: int) -> int:
    """The largest micro-batch whose step (one micro-batch) fits in ``usable`` bytes: one that was
    measured to fit while the line through the measured steps puts the next above ``usable``, or
    the largest measured to fit below the smallest measured not to (0 if a batch of 1 does not)."""

    def bounds() -> tuple[int, int | None]:
        steps = [(m, s.peak["total"] <= usable) for (m, n), s in search.done.items() if n == 1]
        return (max((m for m, ok in steps if ok), default=0), min((m for m, ok in steps if not ok), default=None))

    for _ in range(12):
        lo, hi = bounds()
        if hi is not None and hi - lo <= 1:
            return lo
        line = search.line()
        over = (lambda m: line[0] + line[1] * m > usable) if line and line[1] > 0 else (lambda m: False)
        if lo and over(lo + 1):
            return lo
        if line and line[1] > 0:
            guess = int((usable - line[0]) // line[1])
        else:
            guess = 2 * max(lo, 1)
        top = BATCH_LIMIT if hi is None else hi - 1
        guess = min(max(guess, lo + 1), top)
        if lo >= BATCH_LIMIT:
            return lo
        search(guess)
    return bounds()[0]


def _accumulation(search: _Search, batch: int, usable: int, grads: int) -> tuple[int | None, StepMeasure | None]:
    """The fewest micro-batches (dividing ``batch``) whose step, with the gradients held between
    micro-batches, fits in ``usable``: candidates from the line (the peak of one micro-batch plus the
    gradients), each checked by a step of two micro-batches."""
    line = search.line()
    for a in range(2, batch + 1):
        if batch % a:
            continue
        micro = batch // a
        if line and line[0] + line[1] * micro + grads > usable and micro > 1:
            continue
        step = search(micro, accumulated=True)
        if step.peak["total"] <= usable:
            return a, step
    return None, None


def planned_steps(
    exp, stage: str = "train", batch: int | None = None, items: int | None = None
) -> tuple[int | None, str]:
    """The optimiser steps ``exp``'s ``stage`` runs, and how they were counted: ``train.max_steps``, or
    ``epochs`` x (training items // batch), the items from ``items``, else from a task's ``n_train``
    option (after ``task.train_subset``). (None, why) when the training set's size is known only once
    its data is read."""
    train_cfg = exp.train_config(stage)
    batch = batch or train_cfg.batch_size
    if train_cfg.max_steps:
        return train_cfg.max_steps, "train.max_steps"
    how = "items given"
    if items is None:
        n = exp.task.options.get("n_train")
        if not isinstance(n, int) or isinstance(n, bool):
            return None, (
                f"{train_cfg.epochs} epochs of a training set whose size is known only once its data is "
                "read (--items N gives it)"
            )
        subset = exp.task.train_subset if stage != "pretrain" or exp.compare.pretrain_data != "all" else None
        if isinstance(subset, float):
            items, how = max(1, round(subset * n)), f"task.train_subset {subset} of n_train {n}"
        elif isinstance(subset, int) and not isinstance(subset, bool):
            items, how = min(subset, n), f"task.train_subset {subset}"
        else:
            items, how = n, f"n_train {n}"
    per_epoch = items // batch
    return train_cfg.epochs * per_epoch, f"{train_cfg.epochs} epochs x {per_epoch} steps ({how}, batch {batch})"


def plan_stage(
    exp,
    gpu: GPU,
    *,
    name: str | None = None,
    stage: str = "train",
    objective: str | None = None,
    batch: int | None = None,
    vocab: int | None = None,
    seq_len: int | None = None,
    find_max_batch: bool = True,
    items: int | None = None,
) -> StepPlan:
    """Plan one training step of ``exp``'s ``stage`` on ``gpu`` at ``batch`` (default its
    ``train.batch_size``): see the module docstring. ``find_max_batch=False`` leaves the largest
    batch unsearched (``max_batch`` None) when the batch fits: one fake step instead of three or more.
    ``items``: the training set's size, for the run's steps (:func:`planned_steps`)."""
    if stage == "pretrain" and objective is None:  # the objective the preset compares (else the model's natural one)
        from longrange.experiment.dryrun import pretraining_objectives

        objective = pretraining_objectives(exp)[0]
    train_cfg = exp.train_config(stage)
    batch = batch or train_cfg.batch_size
    if batch < 1:
        raise ConfigError(f"--batch must be at least 1, got {batch}")
    usable = usable_bytes(gpu)
    search = _Search(exp, stage, objective, gpu, vocab, seq_len)
    whole = search(batch)  # the batch in one step
    fits = whole.peak["total"] <= usable
    if find_max_batch or not fits:
        search(max(1, batch // 4) if batch > 1 else 2)  # a second point for the line
    max_batch = _max_batch(search, usable) if find_max_batch or not fits else None
    accumulation, chosen, accumulated_peak = (1, whole, None) if fits else (None, None, None)
    if not fits and max_batch:
        grads = 4 * whole.parameters  # float32 gradients of every parameter: at most this
        accumulation, chosen = _accumulation(search, batch, usable, grads)
        accumulated_peak = chosen.peak if chosen is not None else None
    # The step's figures: the micro-batches of the accumulation chosen (all of the batch at micro-batch 1
    # when nothing fits), each as the measured micro-batch, plus one optimiser step.
    reference = chosen or search(1)
    a = accumulation or batch
    per_step = lambda d, key: a * d[key] / reference.micro_batches + d[key.replace("fwdbwd", "optimizer")]  # noqa: E731
    flops, moved = int(per_step(reference.flops, "fwdbwd")), int(per_step(reference.bytes, "fwdbwd"))
    from longrange.experiment.stage import resolve_stage

    kind = resolve_stage(exp, stage, objective=objective).objective
    steps, steps_how = planned_steps(exp, stage, batch, items)
    return StepPlan(
        name or exp.label,
        stage,
        kind,
        gpu,
        train_cfg.precision,
        batch,
        whole.seq_len,
        whole.inputs,
        whole.parameters,
        batch // a,
        accumulation,
        fits,
        whole.peak,
        accumulated_peak,
        max_batch,
        usable,
        flops,
        moved,
        per_step(reference.time, "fwdbwd"),
        per_step(reference.time, "fwdbwd_compute"),
        moved / gpu.bandwidth,
        whole.kernels,
        steps,
        steps_how,
    )
