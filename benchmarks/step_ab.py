"""Changes to the small models' training step, each against the code it replaced, in one process.

Usage:
    python benchmarks/step_ab.py [--round R] [--models ...] [--steps 7] [--batch-size 64] [--seq-len 256] [--json OUT]
    python benchmarks/step_ab.py --round layouts --mad --models gated-deltanet gla lru h3   # MAD's layers in its CPU cell
    python benchmarks/step_ab.py --round direct-conv --mad --mad-task mad-memorization --models h3 hyena  # another cell
    python benchmarks/step_ab.py --conv-op                 # the long convolution alone, FFT against Toeplitz product

Changes of the small models' training step (docs/small-models.md), each measured as the recall study's model trains it (``demo/recall/<name>``,
one thread, batch 64 x length 256; ``experiment/dryrun.py::prepare_step``), the previous code path
and the current one alternating step by step in this process, so that a loaded machine slows both
alike; the table gives the median CPU time of a step (``time.process_time``) of each.

Round ``layouts`` (the second round of docs/small-models.md):

* ``s4d``, ``dlr``, ``h3`` (its inner S4D): the convolutional layers returned a transposed view of their output, which the
  Simple block's GELU then read mixed with contiguous operands (its backward about 10x slower);
  now their output is laid out as it is shaped;
* ``lru``: the chunked complex scan summed its chunks' states and their starting states through a
  permuted view; now it keeps the chunks position first until one copy at the end;
* ``transformer``: rotary positions multiplied the strided even and odd views of the heads; now
  they rotate the pairs as complex numbers (float32 and float64);
* ``deltanet``, ``gated-deltanet``: the chunked delta rules used chunks of 64 positions everywhere;
  now on a CPU 16 for key widths up to 32 and 32 above
  (``ops/matrix_state/delta_rule.py::default_chunk_size``);
* ``gla``: likewise, chunks of 16 for key widths up to 32 on a CPU (``ops/matrix_state/gla.py``).

Round ``fft-backward`` (the third):

* ``s4d``, ``dlr``, ``h3``, ``hyena``: the FFT convolution's backward was PyTorch's (the backward
  of ``rfft``, a full complex FFT of the padded length); now its own, with real FFTs only
  (``ops/fftconv.py::_FFTConv``).

Round ``direct-conv`` (the fourth; run it at the lengths it changes, e.g. ``--batch-size 32
--seq-len 24``, the demo's; ``--conv-op`` times the convolution alone by length):

* ``s4d``, ``dlr``, ``h3``, ``hyena``: every long convolution ran by FFT; now ``"auto"`` convolves
  CPU inputs of up to 24 positions by one product with the Toeplitz matrix
  (``ops/fftconv.py::_DirectConv``, ``DIRECT_MAX_LENGTH``).

Round ``unmasked`` (the eleventh; ``--mad`` for MAD's layers, ``--batch-size 32 --seq-len 24`` for
the demo's size):

* every model: the backbone got the padding mask of every batch, and its layers multiplied by it
  (in Hyena three products forward and three backward per layer); now a batch without padding
  passes no mask (``models/model.py::unpadded``).

Round ``dense-layouts`` (the twelfth):

* ``s4d``, ``dlr``, ``h3``, ``hyena``: the FFT convolution's skip ``D u`` was a product and a sum
  beside the convolution, on a transposed view; now it is the kernel's tap at lag 0
  (``ops/fftconv.py::with_skip``);
* ``s4d``, ``dlr``, ``h3`` (its inner S4D and its shift convolution), ``hyena``: the layers passed
  transposed views to the convolution and got transposed views of the gradients back, and H3's
  and Hyena's products read them mixed with contiguous tensors; now ``ops/layout.py::transposed``
  lays out both the result and its gradient as shaped (a copy each way).

Round ``denormals`` (the thirteenth): IEEE subnormal floats before, flushed to zero now (the CPU's
flush-to-zero and denormals-are-zero modes, ``train/denormals.py``, which training sets on a CPU);
every model of the recall study.

Round ``narrow-attention`` (the fourteenth; ``--mad`` for MAD's multi-head attention, heads of 4):

* ``transformer``: attention always ran PyTorch's fused kernel; now ``"auto"`` runs the numba
  kernels for narrow heads on a CPU (``ops/attention/dispatch.py``; the recall study's heads of 16
  keep PyTorch's kernel, so run it with ``--mad``);
* ``s4d``, ``dlr``, ``h3``, ``hyena``: the FFT convolution's backward multiplied the output
  gradient's spectrum by the conjugate view of the input's, which PyTorch first copies whole; now
  it conjugates its own gradient's spectrum in place (``ops/fftconv.py::_FFTConv``).

Round ``channels-last-conv`` (the fifteenth; ``--mad`` for MAD's H3 and Hyena):

* ``s4d``, ``dlr``, ``h3``, ``hyena``: the convolutional layers transposed their (batch, length,
  channels) input to (batch, channels, length) for the FFT convolution, which then copied it into
  a zero-filled buffer of the FFT's length, and transposed its output back (each a pass over the
  tensor, forward and backward); now the convolution takes and gives channels last
  (``fft_conv(..., channels_last=True)``), the transposes part of the zero-padding copies, which
  no longer fill the positions they overwrite (``ops/fftconv.py::_padded``).

Round ``narrow-keys`` (the sixteenth; ``--batch-size 32 --seq-len 24`` for the demo's size):

* ``gated-deltanet``: ``"auto"`` ran the matrix-state recurrences' numba kernels for heads of at most
  1,024 state elements, so the recall preset's Gated DeltaNet (2 heads of 32 x 64) ran the chunked
  form; now also for keys of at most 32 features up to 2,048 elements
  (``ops/matrix_state/numba.py::runs_by_default``).

Round ``mamba3-numba`` (the seventeenth; ``--batch-size 32 --seq-len 24`` for the demo's size):

* ``mamba3``: Mamba-3's recurrence ran its chunked form on a CPU; now ``"auto"`` runs its core by
  GLA's numba kernels for the heads of ``runs_by_default`` (``ops/matrix_state/numba.py::mamba3_numba``).

Round ``fused-softplus`` (the eighteenth; ``--mad`` for MAD's Mamba):

* ``simple-s6``, ``mamba-s6``: the selective scan's step bias and softplus ran as PyTorch
  operations before the numba kernels (an add and a softplus forward, their gradients backward,
  each a pass over a (batch, length, channels) tensor); now the channels-last kernels compute them
  row by row, their gradients too (``ops/scan/_numba_kernels.py::fast_softplus``).

Round ``direct-calls`` (the nineteenth; ``--batch-size 32 --seq-len 24`` for the demo's size, ``--mad``
for MAD's layers, whose stacks all run the numba RMS norm and SwiGLU):

* every model with a numba operator (the scans, the short convolution, the RMS norm, SwiGLU,
  attention, the matrix-state recurrences, the Vandermonde and Cauchy products): each call went
  through PyTorch's dispatcher (about 25
  µs, 45 more with autograd); now plain eager calls on CPU tensors run the operator's
  implementation directly, under an ``autograd.Function`` of the same backward
  (``ops/custom_ops.py::autograd_and_eager``); the "before" sets ``EAGER_CALLS`` off.

The "before" paths are kept here, small copies of the code as it was, and only here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor

import longrange.layers.h3 as h3_module
import longrange.layers.hyena as hyena_module
import longrange.layers.rope as rope
import longrange.layers.ssm as ssm
import longrange.models.model as model_module
import longrange.ops.attention.dispatch as attention_dispatch
import longrange.ops.complex_scan.chunked as complex_chunked
import longrange.ops.custom_ops as custom_ops
import longrange.ops.fftconv as fftconv
import longrange.ops.matrix_state.delta_rule as delta_rule
import longrange.ops.matrix_state.dispatch as matrix_state_dispatch
import longrange.ops.matrix_state.gla as gla
import longrange.ops.matrix_state.numba as matrix_state_numba
import longrange.ops.scan.numba as scan_numba
from longrange.layers.base import apply_mask
from longrange.ops.fftconv import fft_conv
from longrange.ops.layout import transposed
from longrange.ops.scan.common import compute_dtype, prepare_delta


def conv_forward_before(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
    self._check_input(x)
    u = apply_mask(x, mask).transpose(1, 2)
    K = self.kernel(x.shape[1])
    return fft_conv(u, K if self.bidirectional else K[0], self.D).transpose(1, 2)


def conv_forward_dense_before(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
    """The convolutional layers between the second round and the twelfth: a transposed view in,
    a contiguous output whose gradient comes back transposed."""
    self._check_input(x)
    u = apply_mask(x, mask).transpose(1, 2)
    K = self.kernel(x.shape[1])
    return fft_conv(u, K if self.bidirectional else K[0], self.D).transpose(1, 2).contiguous()


_CONVOLVE = fftconv._convolve


def convolve_skip_beside(
    u: Tensor,
    k_fwd: Tensor,
    k_bwd: Tensor | None,
    D: Tensor | None,
    work: torch.dtype,
    impl: str,
    chunk_bytes: int,
    channels_last: bool = False,
) -> Tensor:
    """The convolution with its skip ``D u`` added after it, not folded into the kernel (channels
    first, as the layers called it then)."""
    if D is None or impl == "ref" or channels_last:
        return _CONVOLVE(u, k_fwd, k_bwd, D, work, impl, chunk_bytes, channels_last)
    return _CONVOLVE(u, k_fwd, k_bwd, None, work, impl, chunk_bytes) + D.to(work).unsqueeze(-1) * u.to(work)


def lru_scan_before(log_decay: Tensor, v: Tensor, h0: Tensor | None, T: int, impl: str) -> Tensor:
    L = v.shape[-2]
    local_states = complex_chunked._LOCAL[impl]
    if L <= T:
        x = local_states(log_decay, v)
        return x if h0 is None else x + complex_chunked._powers(log_decay, L) * h0.unsqueeze(-2)
    pad = (-L) % T
    if pad:
        v = torch.cat([v, v.new_zeros(*v.shape[:-2], pad, v.shape[-1])], dim=-2)
    nc = (L + pad) // T
    local = local_states(log_decay, v.unflatten(-2, (nc, T)))
    ends = lru_scan_before(T * log_decay, local[..., -1, :], h0, T, impl)
    first = torch.zeros_like(ends[..., :1, :]) if h0 is None else h0.unsqueeze(-2)
    starts = torch.cat([first, ends[..., :-1, :]], dim=-2)
    x = local + complex_chunked._powers(log_decay, T) * starts.unsqueeze(-2)
    return x.flatten(-3, -2)[..., :L, :]


def rotary_before(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    n_pairs = cos.shape[-1]
    even = x[..., 0 : 2 * n_pairs : 2]
    odd = x[..., 1 : 2 * n_pairs : 2]
    rotated = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)
    return rotated if x.shape[-1] == 2 * n_pairs else torch.cat((rotated, x[..., 2 * n_pairs :]), dim=-1)


def fft_core_before(u: Tensor, k: Tensor, n: int, channels_last: bool = False, group: int | None = None) -> Tensor:
    """The FFT convolution with PyTorch's own backward (all channels at once)."""
    if channels_last:
        return fft_core_before(u.transpose(1, 2), k, n).transpose(1, 2)
    return torch.fft.irfft(torch.fft.rfft(u, n=n) * torch.fft.rfft(k, n=n), n=n)[..., : u.shape[-1]]


_FFT_BACKWARD = (fftconv, "_fft_conv_core", fft_core_before)


@staticmethod
@torch.autograd.function.once_differentiable
def fft_backward_conjugate_view(ctx, grad: Tensor):
    """The FFT convolution's backward multiplying by the conjugate view of the input's spectrum."""
    k_f, *spectra = ctx.saved_tensors
    n, cl, group = ctx.n, ctx.channels_last, ctx.group
    grads: list[Tensor] = []
    grad_u = fftconv._spectral(grad, k_f, n, ctx.l, cl, group, conj=True, keep=grads)
    sums = [(g_f * u_f.conj()).sum(0) for g_f, u_f in zip(grads, spectra)]
    grad_k = torch.fft.irfft(torch.cat(sums), n=n)[..., : ctx.lk]
    return grad_u if ctx.needs_input_grad[0] else None, grad_k if ctx.needs_input_grad[1] else None, None, None, None


def conv_forward_transposed_before(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
    """The convolutional layers from the twelfth round to the fifteenth: transposed around a
    channels-first convolution."""
    self._check_input(x)
    u = transposed(apply_mask(x, mask))
    K = self.kernel(x.shape[1])
    return transposed(fft_conv(u, K if self.bidirectional else K[0], self.D))


def h3_shift_transposed_before(self, k: Tensor) -> Tensor:
    C = self.shift_C if self.bidirectional else self.shift_C[0]
    return transposed(fft_conv(transposed(k), C, self.shift_D))


def hyena_forward_transposed_before(self, x: Tensor, mask: Tensor | None = None, view=transposed) -> Tensor:
    """Hyena's forward channels first (``view``: how it transposed, a copy each way since the twelfth
    round, a view before it)."""
    self._check_input(x)
    L = x.shape[1]
    self._check_length(L)
    u = apply_mask(self.in_proj(apply_mask(x, mask)), mask)
    u = view(apply_mask(self._short(u), mask))
    *gates, v = u.split(self.d_model, dim=1)
    k = self.kernels(L)
    bias = self.bias.view(self.d_model, self.order - 1)
    for o, gate in enumerate(reversed(gates[1:])):
        v = self.dropout(v * gate)
        kernel = (k[0, :, o], k[1, :, o]) if self.bidirectional else k[0, :, o]
        v = fft_conv(v, kernel, bias[:, o], impl=self.conv_impl)
    return self.out_proj(view(gates[0] * v))


class FFTConvFilledBefore(torch.autograd.Function):
    """The FFT convolution of one group of channels before the fifteenth round: channels first,
    padded by ``rfft(u, n=n)``."""

    @staticmethod
    def forward(ctx, u: Tensor, k: Tensor, n: int) -> Tensor:
        u_f = torch.fft.rfft(u, n=n)
        k_f = torch.fft.rfft(k, n=n)
        ctx.save_for_backward(u_f, k_f)
        ctx.n, ctx.l, ctx.lk = n, u.shape[-1], k.shape[-1]
        return torch.fft.irfft(u_f * k_f, n=n)[..., : u.shape[-1]]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        u_f, k_f = ctx.saved_tensors
        g_f = torch.fft.rfft(grad, n=ctx.n)
        grad_u = torch.fft.irfft(g_f * k_f.conj(), n=ctx.n)[..., : ctx.l] if ctx.needs_input_grad[0] else None
        grad_k = None
        if ctx.needs_input_grad[1]:
            g_f.imag.neg_()
            grad_k = torch.fft.irfft((g_f * u_f).sum(0).conj(), n=ctx.n)[..., : ctx.lk]
        return grad_u, grad_k, None


def convolve_before_fifteenth(
    u: Tensor,
    k_fwd: Tensor,
    k_bwd: Tensor | None,
    D: Tensor | None,
    work: torch.dtype,
    impl: str,
    chunk_bytes: int,
    channels_last: bool = False,
) -> Tensor:
    """``fftconv._convolve`` by FFT before the fifteenth round (channels first): groups of channels
    whose spectra fit ``chunk_bytes`` (16 MB), each its own autograd node, concatenated."""
    if impl != "fft" or channels_last:
        return _CONVOLVE(u, k_fwd, k_bwd, D, work, impl, chunk_bytes, channels_last)
    l = u.shape[-1]
    u_w = u.to(work)
    lk = min(k_fwd.shape[-1], l)
    k_fwd = k_fwd[..., :lk]
    if D is not None:
        k_fwd = fftconv.with_skip(k_fwd.to(work), D.to(work))
    n = fftconv.fast_fft_size(l + lk)
    if k_bwd is None:
        k_full = k_fwd
    else:
        k_full = torch.cat([k_fwd, k_fwd.new_zeros(k_fwd.shape[0], n - 2 * lk), k_bwd[..., :lk].flip(-1)], dim=-1)
    per_channel = u.shape[0] * (n // 2 + 1) * 2 * torch.empty((), dtype=work).element_size()
    group = fftconv.group_size(per_channel, chunk_bytes)
    parts = [
        FFTConvFilledBefore.apply(u_w[:, c : c + group], k_full[c : c + group].to(work), n)
        for c in range(0, u.shape[1], group)
    ]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def selective_scan_numba_before(
    u,
    delta,
    A,
    B,
    C,
    D=None,
    z=None,
    delta_bias=None,
    delta_softplus=False,
    return_last_state=False,
    initial_state=None,
):
    """The numba scan with the step's bias and softplus applied by PyTorch before the kernels (the
    channels-last path; the round's models take no other)."""
    dtype = compute_dtype(u, delta, A, B, C, D, z, delta_bias, initial_state)
    d = u.shape[1]

    def prep(t):
        return None if t is None else t.to(dtype).contiguous()

    def prep_cl(t):
        return None if t is None else t.to(dtype).transpose(1, 2).contiguous()

    B4, C4 = scan_numba._as_4d(B.to(dtype), d), scan_numba._as_4d(C.to(dtype), d)
    chunk = scan_numba._cl_chunk(d, A.shape[1], B4, C4, dtype.itemsize)
    dt = prepare_delta(delta.transpose(1, 2), delta_bias, delta_softplus, dtype, channel_dim=-1)
    out, last, _ = scan_numba._scan_cl_op(
        prep_cl(u), dt.contiguous(), prep(A), B4, C4, prep(D), prep_cl(z), prep(initial_state), None, False, chunk
    )
    out = out.transpose(1, 2).to(u.dtype)
    return (out, last) if return_last_state else out


_CONJUGATE_VIEW = (fftconv._FFTConv, "backward", fft_backward_conjugate_view)
_SDPA_ONLY = [(attention_dispatch, "NUMBA_MAX_WIDTH", 0), (attention_dispatch, "NUMBA_MAX_WIDTH_BIDIRECTIONAL", 0)]

#: ``--mad``: MAD's layer of each change (the CPU protocol's cell, ``studies/mad.py``).
MAD_LAYERS = {
    "transformer": "mh-attention",
    "mamba-s6": "mamba",
    "mamba2": "mamba2",
    "gated-deltanet": "gated-deltanet",
    "gla": "mh-gated-linear-attention",
    "lru": "lru",
    "h3": "h3",
    "hyena": "hyena",
}


def _small_models():
    """``benchmarks/small_models.py`` (beside this script), loaded for its list of models."""
    import importlib.util

    path = Path(__file__).resolve().parent / "small_models.py"
    spec = importlib.util.spec_from_file_location("small_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SKIP_BESIDE = (fftconv, "_convolve", convolve_skip_beside)
_CONV_VIEWS = (ssm.ConvolutionalSSM, "forward", conv_forward_dense_before)


def _view(x: Tensor) -> Tensor:  # H3's shift and Hyena's gates: transposed views, forward and backward
    return x.transpose(-1, -2)


def h3_shift_view_before(self, k: Tensor) -> Tensor:
    C = self.shift_C if self.bidirectional else self.shift_C[0]
    return _view(fft_conv(_view(k), C, self.shift_D))


def hyena_forward_view_before(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
    return hyena_forward_transposed_before(self, x, mask, view=_view)


_FILLED = [(fftconv, "_convolve", convolve_before_fifteenth)]


#: The recall study's models (``demo/recall/<name>``), as ``small_models.py`` measures them.
RECALL_MODELS = tuple(_small_models().MODELS)

#: round -> model -> (module, attribute, the code it replaced), or a list of those.
ROUNDS = {
    "layouts": {
        "s4d": (ssm.ConvolutionalSSM, "forward", conv_forward_before),
        "dlr": (ssm.ConvolutionalSSM, "forward", conv_forward_before),
        "h3": (ssm.ConvolutionalSSM, "forward", conv_forward_before),  # its inner S4D
        "lru": (complex_chunked, "_scan", lru_scan_before),
        "transformer": (rope, "apply_rotary", rotary_before),
        "deltanet": (delta_rule, "default_chunk_size", lambda k: 64),
        "gated-deltanet": (delta_rule, "default_chunk_size", lambda k: 64),
        "gla": (gla, "default_chunk_size", lambda k: 64),
    },
    "fft-backward": {"s4d": _FFT_BACKWARD, "dlr": _FFT_BACKWARD, "h3": _FFT_BACKWARD, "hyena": _FFT_BACKWARD},
    # "auto" convolved every length by FFT: no length is short enough for the direct product
    "direct-conv": {m: (fftconv, "DIRECT_MAX_LENGTH", 0) for m in ("s4d", "dlr", "h3", "hyena")},
    "dense-layouts": {
        "s4d": [_SKIP_BESIDE, _CONV_VIEWS],
        "dlr": [_SKIP_BESIDE, _CONV_VIEWS],
        "h3": [_SKIP_BESIDE, _CONV_VIEWS, (h3_module.H3, "shift", h3_shift_view_before)],
        "hyena": [_SKIP_BESIDE, (hyena_module.Hyena, "forward", hyena_forward_view_before)],
    },
    # every batch's mask went to the layers, padded or not
    "unmasked": {m: (model_module, "unpadded", lambda lengths, length: False) for m in MAD_LAYERS},
    # subnormals kept: no attribute changes, the step sets the CPU's mode (measure())
    "denormals": {m: [] for m in RECALL_MODELS},
    "narrow-attention": {
        "transformer": _SDPA_ONLY,
        "s4d": _CONJUGATE_VIEW,
        "dlr": _CONJUGATE_VIEW,
        "h3": _CONJUGATE_VIEW,
        "hyena": _CONJUGATE_VIEW,
    },
    "channels-last-conv": {
        "s4d": [(ssm.ConvolutionalSSM, "forward", conv_forward_transposed_before), *_FILLED],
        "dlr": [(ssm.ConvolutionalSSM, "forward", conv_forward_transposed_before), *_FILLED],
        "h3": [
            (ssm.ConvolutionalSSM, "forward", conv_forward_transposed_before),
            (h3_module.H3, "shift", h3_shift_transposed_before),
            *_FILLED,
        ],
        "hyena": [(hyena_module.Hyena, "forward", hyena_forward_transposed_before), *_FILLED],
    },
    "narrow-keys": {"gated-deltanet": (matrix_state_numba, "AUTO_KEY_WIDTH", 0)},
    "mamba3-numba": {"mamba3": (matrix_state_dispatch.DISPATCHERS["mamba3"], "default", "chunk")},
    "fused-softplus": {
        m: (scan_numba, "selective_scan_numba", selective_scan_numba_before) for m in ("simple-s6", "mamba-s6")
    },
    "direct-calls": {m: (custom_ops, "EAGER_CALLS", False) for m in RECALL_MODELS},
}
LATEST = "direct-calls"


@contextmanager
def before(model: str, round_: str = LATEST):
    patches = ROUNDS[round_][model]
    patches = patches if isinstance(patches, list) else [patches]
    current = [getattr(owner, name) for owner, name, _ in patches]
    for owner, name, old in patches:
        setattr(owner, name, old)
    try:
        yield
    finally:
        for (owner, name, _), new in zip(patches, current):
            setattr(owner, name, new)


def experiment(model: str, seq_len: int, mad: bool, mad_task: str = "mad-in-context-recall"):
    """The recall study's model at ``seq_len``, or with ``mad`` MAD's layer in the CPU protocol's
    cell of ``mad_task``'s baseline (its own length and batch)."""
    if not mad:
        return _small_models().recall_experiment(model, seq_len)
    from longrange.studies import mad as M

    protocol = {k: v for k, v in M.CPU_PROTOCOL.items() if k in ("tasks", "levels", "lrs", "wds", "overrides")}
    settings = M.MadSettings(models=(MAD_LAYERS[model],), **protocol)
    return M.cell_experiment(settings, MAD_LAYERS[model], mad_task, "baseline", 5e-4, 0.0)


def measure(
    model: str,
    steps: int,
    batch_size: int,
    seq_len: int,
    mad: bool = False,
    round_: str = LATEST,
    mad_task: str = "mad-in-context-recall",
) -> dict:
    from longrange.experiment.dryrun import prepare_step

    exp = experiment(model, seq_len, mad, mad_task)
    if mad:  # the stage's own batch and the task's length
        batch_size, seq_len = None, None
    prepared = {}
    for which in ("before", "now"):
        torch.manual_seed(0)
        prepared[which] = prepare_step(exp, "train", device="cpu", batch_size=batch_size, seq_len=seq_len)
    times: dict[str, list[float]] = {"before": [], "now": []}

    def step(which: str, record: bool) -> None:
        if round_ == "denormals":  # the "before" keeps IEEE subnormals, "now" flushes as training does
            torch.set_flush_denormal(which == "now")
        start = time.process_time()
        if which == "before":
            with before(model, round_):
                prepared[which].step()
        else:
            prepared[which].step()
        if record:
            times[which].append(time.process_time() - start)

    for i in range(2 + steps):  # two untimed steps of each first
        for which in ("before", "now") if i % 2 else ("now", "before"):
            step(which, record=i >= 2)
    if round_ == "denormals":
        torch.set_flush_denormal(True)  # as training (and prepare_step) left it
    row = {k: 1000 * statistics.median(v) for k, v in times.items()}
    name = f"{MAD_LAYERS[model]} (MAD's {mad_task} cell)" if mad else model
    return {"model": name, "before_ms": round(row["before"], 1), "now_ms": round(row["now"], 1)}


#: ``--conv-op``: (batch, channels, length) of the long convolution alone.
CONV_OP_SHAPES = [(32, 64, 16), (32, 64, 24), (32, 64, 32), (64, 64, 32), (32, 64, 48), (32, 64, 64), (32, 128, 128)]


def measure_conv_op(b: int, h: int, l: int, reps: int = 21) -> dict:
    """``fft_conv`` by FFT and by the Toeplitz product, forward and backward (input, kernel and skip
    gradients), on an input laid out as the layers pass it (a transposed view of (b, l, h)),
    alternating; the median CPU time of each."""
    u0, k0, D = torch.randn(b, l, h), torch.randn(h, l), torch.randn(h)
    times: dict[str, list[float]] = {"fft": [], "direct": []}
    for i in range(reps + 3):
        for impl in ("fft", "direct") if i % 2 else ("direct", "fft"):
            u, k = u0.clone().requires_grad_(), k0.clone().requires_grad_()
            start = time.process_time()
            fftconv.fft_conv(u.transpose(1, 2), k, D, impl=impl).sum().backward()
            if i >= 3:
                times[impl].append(time.process_time() - start)
    row = {k: round(1000 * statistics.median(v), 3) for k, v in times.items()}
    return {"batch": b, "channels": h, "length": l, "fft_ms": row["fft"], "direct_ms": row["direct"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--round", default=LATEST, choices=list(ROUNDS), help=f"which changes (default {LATEST})")
    p.add_argument("--models", nargs="+", default=None, help="default: every model of the round")
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument(
        "--mad", action="store_true", help=f"MAD's layers in the CPU protocol's cell instead ({', '.join(MAD_LAYERS)})"
    )
    p.add_argument(
        "--mad-task", default="mad-in-context-recall", help="with --mad: the task whose cell (default %(default)s)"
    )
    p.add_argument(
        "--conv-op",
        action="store_true",
        help="the long convolution alone, by FFT and by the Toeplitz product, by length",
    )
    args = p.parse_args(argv)
    if args.conv_op:
        torch.set_num_threads(1)
        rows = [measure_conv_op(*shape) for shape in CONV_OP_SHAPES]
        print("fft_conv, forward and backward, one thread; median CPU ms")
        print("\n| batch x channels x length | fft | direct | direct / fft |\n|---|---:|---:|---:|")
        for r in rows:
            ratio = r["direct_ms"] / r["fft_ms"]
            print(
                f"| {r['batch']} x {r['channels']} x {r['length']} | {r['fft_ms']:.2f} | {r['direct_ms']:.2f} | {ratio:.2f} |"
            )
        if args.json:
            args.json.write_text(
                json.dumps({"settings": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=1)
            )
        return 0
    changes = ROUNDS[args.round]
    args.models = args.models or list(changes)
    if not set(args.models) <= set(changes):
        p.error(f"round {args.round} changes {', '.join(changes)}; name those with --models")
    if args.mad and not set(args.models) <= set(MAD_LAYERS):
        p.error(f"--mad measures {', '.join(MAD_LAYERS)}; name those with --models")
    torch.set_num_threads(1)
    rows = [
        measure(m, args.steps, args.batch_size, args.seq_len, args.mad, args.round, args.mad_task) for m in args.models
    ]
    shape = (
        f"MAD's CPU cell ({args.mad_task}, its batch and length)"
        if args.mad
        else (f"batch {args.batch_size} x length {args.seq_len}")
    )
    print(f"Round {args.round}: training step, {shape}, one thread; median CPU ms of {args.steps}")
    print("\n| model | before | now | speed-up |\n|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['before_ms']:.1f} | {r['now_ms']:.1f} | {r['before_ms'] / r['now_ms']:.2f}x |")
    if args.json:
        args.json.write_text(json.dumps({"settings": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
