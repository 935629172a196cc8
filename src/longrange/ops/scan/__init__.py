"""The selective scan of S6 (Mamba), with the call signature of ``mamba_ssm``'s ``selective_scan_fn``.

Shapes (b: batch, d: channels, n: state size, l: length, g: groups of B/C)::

    u, delta, z       (b, d, l)
    A                 (d, n), real (normally negative)
    B, C              (d, n) time-invariant, (b, n, l) shared by all channels, or
                      (b, g, n, l) grouped: channel c reads group c // (d // g)
    D, delta_bias     (d,)
    initial_state     (b, d, n)
    output            (b, d, l) in u's dtype; with ``return_last_state`` also (b, d, n)

Semantics, per channel and state index::

    delta <- delta + delta_bias;  delta <- softplus(delta) if delta_softplus
    h_t = exp(delta_t * A) * h_{t-1} + delta_t * B_t * u_t      (ZOH for A, Euler for B)
    y_t = <C_t, h_t> + D * u_t;   y_t <- y_t * silu(z_t) if z is given

Computation runs in float64 if any floating input is float64, else in float32.

The package, one module per implementation beside the arguments' checks they share:

- :mod:`.common`: shape checks and preparation shared by all implementations;
- :mod:`.reference`: ``"ref"``, :func:`selective_scan_ref`, a plain loop over time; slow and
  obviously correct;
- :mod:`.chunked`: ``"chunked"``, :func:`selective_scan_chunked`, a chunked parallel scan in
  PyTorch (see :func:`linear_scan`) with a hand-written backward that runs the same scan in
  reverse; memory of a few (l, b, d, n) tensors, never (l x l);
- :mod:`.numba`: ``"numba"``, the scan fused into one compiled loop per direction on CPU tensors
  (numba), with a hand-written backward; memory of a few (b, d, l) tensors; vectorised over
  channels, in (b, l, d) memory, where B and C are time-varying (S6, Mamba);
- :mod:`.triton`: ``"triton"``, Triton kernels (CUDA; CPU in Triton's interpreter);
- ``"cuda"``: the ``mamba_ssm`` kernel (CUDA tensors, no ``initial_state``, not float64; only
  when its compiled extension ``selective_scan_cuda`` imports, see :mod:`longrange._optional`);
- :mod:`.dispatch`: :func:`selective_scan`, which runs the one named by ``impl`` (its
  :data:`DISPATCHER` follows the convention of :mod:`longrange.ops.dispatch`); ``"auto"``
  (default, see :func:`auto_impl`) is on CUDA tensors ``"cuda"`` when usable, else ``"triton"``
  when triton imports, else ``"chunked"``; on CPU tensors ``"numba"`` when numba imports, else
  ``"chunked"``.

Determinism of the backward: "ref", "chunked" and "numba" are deterministic; "triton" and "cuda"
are not (atomic additions); under ``torch.use_deterministic_algorithms(True)`` "auto" picks only
deterministic ones and naming another raises (see :data:`DETERMINISTIC_BACKWARD`).
"""

from longrange.ops.scan.chunked import CHUNK_METHODS, DEFAULT_CHUNK_SIZE, linear_scan, selective_scan_chunked
from longrange.ops.scan.dispatch import (
    DETERMINISTIC_BACKWARD,
    DISPATCHER,
    IMPLS,
    auto_impl,
    available_impls,
    default_impl,
    selective_scan,
    set_default_impl,
)
from longrange.ops.scan.reference import selective_scan_ref

__all__ = [
    "CHUNK_METHODS",
    "DEFAULT_CHUNK_SIZE",
    "DETERMINISTIC_BACKWARD",
    "DISPATCHER",
    "IMPLS",
    "auto_impl",
    "available_impls",
    "default_impl",
    "linear_scan",
    "selective_scan",
    "selective_scan_chunked",
    "selective_scan_ref",
    "set_default_impl",
]
