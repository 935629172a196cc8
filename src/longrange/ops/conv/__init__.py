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

The package, one module per implementation beside what they share:

- :mod:`.common`: the activations and the arguments' checks;
- :mod:`.reference`: ``"ref"``, :func:`causal_conv1d_ref`, an explicit sum over the taps;
- :mod:`.numba`: ``"numba"``, the taps, bias and SiLU fused into compiled loops for CPUs, channels
  last (kernels in :mod:`._numba_kernels`);
- ``"torch"``: PyTorch's grouped convolution; ``"cuda"``: the ``causal-conv1d`` kernel (CUDA
  tensors, widths 2 to 4, not float64; only when its compiled extension ``causal_conv1d_cuda``
  imports, see :mod:`longrange._optional`);
- :mod:`.dispatch`: :func:`causal_conv1d`, which runs the implementation named by ``impl``
  (:data:`IMPLS`; None: the default, :func:`set_default_impl`; ``"auto"``: see :func:`auto_impl`;
  :func:`available_impls` lists those that can run on a device) and reports it to
  :mod:`longrange.ops.used` (op ``"causal_conv1d"``);
- :mod:`.step`: :func:`causal_conv1d_update`, the generation step.

Determinism (:data:`DETERMINISTIC_BACKWARD`): with ``torch.use_deterministic_algorithms(True)``,
``"auto"`` runs ``"numba"`` or ``"torch"`` (PyTorch's convolution, deterministic in that mode)
rather than the causal-conv1d kernel, whose backward adds each batch element's weight and bias
gradients with atomic additions; asking for ``"cuda"`` by name raises (warns in ``warn_only`` mode).
"""

from longrange.ops.conv.common import ACTIVATIONS
from longrange.ops.conv.dispatch import (
    CUDA_WIDTHS,
    DETERMINISTIC_BACKWARD,
    DISPATCHER,
    IMPLS,
    auto_impl,
    available_impls,
    causal_conv1d,
    default_impl,
    set_default_impl,
)
from longrange.ops.conv.reference import causal_conv1d_ref
from longrange.ops.conv.step import causal_conv1d_update

__all__ = [
    "ACTIVATIONS",
    "CUDA_WIDTHS",
    "DETERMINISTIC_BACKWARD",
    "DISPATCHER",
    "IMPLS",
    "auto_impl",
    "available_impls",
    "causal_conv1d",
    "causal_conv1d_ref",
    "causal_conv1d_update",
    "default_impl",
    "set_default_impl",
]
