"""Causal depthwise 1-D convolution, with the semantics of the ``causal-conv1d`` package.

Shapes (b: batch, d: channels, l: length, w: kernel width)::

    x       (b, d, l)
    weight  (d, w)          (an ``nn.Conv1d(d, d, w, groups=d)`` weight is (d, 1, w): squeeze dim 1)
    bias    (d,)
    output  (b, d, l):  y[:, c, t] = sum_k weight[c, k] * x[:, c, t - (w - 1) + k]  (+ bias[c])

with zeros before the start (so the output at t only sees inputs up to t), followed by the
optional activation ``"silu"`` (alias ``"swish"``).

Generation keeps a rolling window of recent inputs, ``conv_state`` of shape (b, d, s) with any
``s >= w - 1`` (the last ``s`` inputs, oldest first; zeros before the start). ``s = w - 1`` is
enough; Mamba's own step keeps ``s = w``. :func:`causal_conv1d_update` returns the output and the
shifted state, so stepping through a sequence from a zero state reproduces :func:`causal_conv1d`.

:func:`causal_conv1d` runs the implementation named by ``impl`` (:data:`IMPLS`; ``"auto"``: see
:func:`auto_impl`; :func:`available_impls` lists those that can run on a device) and reports it
to :mod:`longrange.ops.used` (op ``"causal_conv1d"``).

Determinism (:data:`DETERMINISTIC_BACKWARD`): with ``torch.use_deterministic_algorithms(True)``,
``"auto"`` runs ``"torch"`` (PyTorch's convolution, deterministic in that mode) rather than the
causal-conv1d kernel, whose backward adds each batch element's weight and bias gradients with
atomic additions; asking for ``"cuda"`` by name raises (warns in ``warn_only`` mode).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from longrange import _optional
from longrange.ops import conv_numba, used
from longrange.ops.determinism import refuse_nondeterministic

ACTIVATIONS = (None, "silu", "swish")
IMPLS = ("auto", "torch", "ref", "numba", "cuda")
#: Whether each implementation's backward gives the same bits for the same inputs: "cuda" (the
#: causal-conv1d kernel) adds the weight and bias gradients of the batch elements' thread blocks
#: with atomic additions, whose order can change from run to run.
DETERMINISTIC_BACKWARD = {"torch": True, "ref": True, "numba": True, "cuda": False}


def _check_activation(activation: str | None) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"causal_conv1d: activation must be one of {ACTIVATIONS}, got {activation!r}")


def _check_weight_bias(weight: Tensor, bias: Tensor | None, d: int) -> None:
    if weight.dim() != 2 or weight.shape[0] != d or weight.shape[1] < 1:
        raise ValueError(f"causal_conv1d: weight must have shape (d, width) with d={d}, got {tuple(weight.shape)}")
    if bias is not None and bias.shape != (d,):
        raise ValueError(f"causal_conv1d: bias must have shape (d,)=({d},), got {tuple(bias.shape)}")


def _check_conv_inputs(x: Tensor, weight: Tensor, bias: Tensor | None, activation: str | None) -> None:
    if x.dim() != 3:
        raise ValueError(f"causal_conv1d: x must have shape (batch, d, length), got {tuple(x.shape)}")
    _check_weight_bias(weight, bias, x.shape[1])
    _check_activation(activation)


def _activate(y: Tensor, activation: str | None) -> Tensor:
    return F.silu(y) if activation in ("silu", "swish") else y


def causal_conv1d_ref(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str | None = None
) -> Tensor:
    """Reference: an explicit sum over the kernel taps."""
    _check_conv_inputs(x, weight, bias, activation)
    w = weight.shape[1]
    l = x.shape[-1]
    padded = F.pad(x, (w - 1, 0))
    y = torch.zeros_like(x) if bias is None else bias[:, None].to(x.dtype).expand_as(x).clone()
    for k in range(w):
        # tap k multiplies the input (w - 1 - k) steps back
        y = y + weight[:, k, None] * padded[..., k : k + l]
    return _activate(y, activation)


#: Kernel widths the ``causal-conv1d`` CUDA kernel supports.
CUDA_WIDTHS = (2, 3, 4)


def _cuda_usable(device: torch.device, width: int, dtype: torch.dtype) -> bool:
    return (
        _optional.causal_conv1d_cuda_fn is not None
        and device.type == "cuda"
        and width in CUDA_WIDTHS
        and dtype in (torch.float32, torch.float16, torch.bfloat16)
    )


def _numba_usable(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype.is_floating_point and conv_numba.numba_available()


def auto_impl(device: torch.device | str, width: int = 4, dtype: torch.dtype = torch.float32,
              deterministic: bool | None = None) -> str:
    """The implementation ``impl="auto"`` runs: ``"cuda"`` (the ``causal-conv1d`` kernel) for
    CUDA inputs when its compiled extension ``causal_conv1d_cuda`` imports (see
    :mod:`longrange._optional`), the width is 2 to 4 and the dtype not float64; ``"numba"``
    (:mod:`longrange.ops.conv_numba`) for CPU inputs when numba imports; else ``"torch"``.
    ``deterministic`` (None: ``torch.are_deterministic_algorithms_enabled()``): not ``"cuda"``."""
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    device = torch.device(device)
    if not deterministic and _cuda_usable(device, width, dtype):
        return "cuda"
    return "numba" if _numba_usable(device, dtype) else "torch"


def available_impls(device: torch.device | str) -> tuple[str, ...]:
    """The implementations that can run on tensors of ``device`` here (``"auto"`` excluded):
    ``"ref"`` and ``"torch"`` everywhere, ``"numba"`` on CPUs when numba imports, ``"cuda"`` on
    CUDA when causal-conv1d's compiled extension imports (widths 2 to 4, not float64)."""
    device = torch.device(device)
    impls = ("ref", "torch")
    if _numba_usable(device, torch.float32):
        impls += ("numba",)
    if _cuda_usable(device, CUDA_WIDTHS[-1], torch.float32):
        impls += ("cuda",)
    return impls


def causal_conv1d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
    impl: str = "auto",
) -> Tensor:
    """Causal depthwise convolution (see the module docstring).

    ``impl``: ``"auto"`` (see :func:`auto_impl`), ``"torch"`` (grouped ``conv1d`` with left
    padding), ``"ref"``, ``"numba"`` (CPU; computed in float32, or float64 for float64 inputs),
    ``"cuda"``.
    """
    if impl not in IMPLS:
        raise ValueError(f"causal_conv1d: unknown impl {impl!r}; expected one of {IMPLS}")
    _check_conv_inputs(x, weight, bias, activation)
    if impl == "auto":
        impl = auto_impl(x.device, weight.shape[1], x.dtype)
    elif not DETERMINISTIC_BACKWARD[impl]:
        refuse_nondeterministic("causal_conv1d", impl, "atomic additions of the weight and bias gradients",
                                ["torch", "ref"], stacklevel=2)
    if impl == "cuda":
        if not _cuda_usable(x.device, weight.shape[1], x.dtype):
            reason = _optional.status()["causal_conv1d"].get("reason", "")
            raise RuntimeError(
                "causal_conv1d: impl='cuda' needs the causal-conv1d package with its compiled extension "
                f"causal_conv1d_cuda{f' ({reason})' if reason else ''}, CUDA tensors, a width in {CUDA_WIDTHS} "
                "and float32/float16/bfloat16 inputs"
            )
        y = _optional.causal_conv1d_cuda_fn(x, weight, bias, activation=activation)
    elif impl == "ref":
        y = causal_conv1d_ref(x, weight, bias, activation)
    elif impl == "numba":
        y = conv_numba.causal_conv1d_numba(x, weight, bias, silu=activation in ("silu", "swish"))
    else:
        w = weight.shape[1]
        y = _activate(F.conv1d(F.pad(x, (w - 1, 0)), weight[:, None, :], bias, groups=x.shape[1]), activation)
    used.note("causal_conv1d", impl)
    return y


def causal_conv1d_update(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
) -> tuple[Tensor, Tensor]:
    """One generation step (or a few): returns ``(y, new_conv_state)``; does not modify its inputs.

    ``x``: (b, d) for one step or (b, d, k) for k steps; ``conv_state``: (b, d, s) with
    ``s >= width - 1``, the last ``s`` inputs (oldest first). ``y`` has the shape of ``x``;
    ``new_conv_state`` has the shape of ``conv_state`` and ends with the newest input.
    """
    single = x.dim() == 2
    xs = x[..., None] if single else x
    if xs.dim() != 3:
        raise ValueError(f"causal_conv1d_update: x must have shape (batch, d) or (batch, d, steps), got {tuple(x.shape)}")
    b, d, _ = xs.shape
    _check_weight_bias(weight, bias, d)
    _check_activation(activation)
    w = weight.shape[1]
    if conv_state.dim() != 3 or conv_state.shape[:2] != (b, d) or conv_state.shape[2] < w - 1:
        raise ValueError(
            f"causal_conv1d_update: conv_state must have shape (batch, d, s)=({b}, {d}, s) with s >= width - 1 = {w - 1}, "
            f"got {tuple(conv_state.shape)}"
        )
    s = conv_state.shape[2]
    window = torch.cat([conv_state.to(xs.dtype), xs], dim=-1)  # (b, d, s + k)
    y = F.conv1d(window[..., s - (w - 1) :], weight[:, None, :].to(xs.dtype), bias, groups=d)
    y = _activate(y, activation)
    new_state = window[..., window.shape[-1] - s :]
    return (y[..., 0] if single else y), new_state
