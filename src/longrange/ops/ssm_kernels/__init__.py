"""Convolution kernels of linear time-invariant SSMs, each with an explicit-recurrence reference.

An SSM x' = A x + B u, y = C x discretised with step ``dt`` has the kernel K[l] = C Ā^l B̄, so
that y = K * u (causal convolution). Two structures of A are covered:

* diagonal (S4D): :func:`diag_ssm_kernel`, by a Vandermonde product (:func:`vandermonde_kernel`);
* diagonal plus low rank (S4): :func:`dplr_generating_kernel` and :func:`dplr_ssm_kernel`, by
  evaluating the generating function at the roots of unity with Cauchy sums (:func:`cauchy`) and
  the Woodbury identity, then an inverse FFT.

Discretisations (per channel, elementwise for a diagonal A):

* ``zoh``:      Ā = exp(dt A),                       B̄ = (Ā - I) A^{-1} B
* ``bilinear``: Ā = (I - dt/2 A)^{-1} (I + dt/2 A),  B̄ = dt (I - dt/2 A)^{-1} B

The two products have several implementations, chosen in one place per op
(:mod:`.dispatch`; ``impl=`` forces one): ``ref`` (:mod:`.reference`), ``chunked`` (PyTorch,
:mod:`.chunked`), ``numba`` (fused CPU kernels, :mod:`.numba`), ``triton`` (GPU kernels,
:mod:`.triton`) and, for the Cauchy sum, ``pykeops`` (:mod:`.keops`). :mod:`.common` holds what
they share (argument checks, dtypes, layouts); the implementations never import each other.

Layout of the package::

    common.py      argument checks, dtypes, canonical layouts
    reference.py   vandermonde_kernel_ref, cauchy_ref
    chunked.py     PyTorch over bounded pieces
    numba.py       numba kernels (_numba_kernels.py), hand-written backward
    triton.py      Triton kernels (_triton_kernels.py), hand-written backward
    keops.py       pykeops Cauchy sum
    dispatch.py    vandermonde_kernel, cauchy: their dispatchers (longrange.ops.dispatch), used.note
    diag.py        S4D: discretisation, diag_ssm_kernel
    dplr.py        S4: DPLR matrices, dplr_generating_kernel, dplr_ssm_kernel

The same discretisation helpers are used by the layers' recurrent (step) modes, so the
convolutional and recurrent modes agree by construction.
"""

from longrange.ops.ssm_kernels.chunked import CAUCHY_CHUNK_ELEMENTS
from longrange.ops.ssm_kernels.diag import DISCRETIZATIONS, diag_ssm_kernel, diag_ssm_kernel_ref, discretize_diag
from longrange.ops.ssm_kernels.dispatch import (
    CAUCHY_DISPATCHER,
    DETERMINISTIC_BACKWARD,
    IMPLS,
    OPS,
    VANDERMONDE_DISPATCHER,
    auto_impl,
    available_impls,
    cauchy,
    cauchy_impl,
    default_impl,
    set_default_impl,
    vandermonde_kernel,
)
from longrange.ops.ssm_kernels.dplr import (
    bilinear_dense,
    c_tilde_to_c,
    c_to_c_tilde,
    complete_conj,
    dense_ssm_kernel_ref,
    dplr_dense,
    dplr_generating_kernel,
    dplr_ssm_kernel,
    dplr_ssm_kernel_ref,
)
from longrange.ops.ssm_kernels.reference import cauchy_ref, vandermonde_kernel_ref

__all__ = [
    "CAUCHY_CHUNK_ELEMENTS",
    "CAUCHY_DISPATCHER",
    "DETERMINISTIC_BACKWARD",
    "DISCRETIZATIONS",
    "IMPLS",
    "OPS",
    "VANDERMONDE_DISPATCHER",
    "auto_impl",
    "available_impls",
    "bilinear_dense",
    "c_tilde_to_c",
    "c_to_c_tilde",
    "cauchy",
    "cauchy_impl",
    "cauchy_ref",
    "complete_conj",
    "default_impl",
    "dense_ssm_kernel_ref",
    "diag_ssm_kernel",
    "diag_ssm_kernel_ref",
    "discretize_diag",
    "dplr_dense",
    "dplr_generating_kernel",
    "dplr_ssm_kernel",
    "dplr_ssm_kernel_ref",
    "set_default_impl",
    "vandermonde_kernel",
    "vandermonde_kernel_ref",
]
