"""Complex diagonal linear recurrences with a time-invariant decay (the LRU's scan).

The recurrence, per state channel n (the LRU's, Orvieto et al. 2023, arXiv 2303.06349)::

    x_t = λ_n x_{t-1} + v_t      (x_{-1} = h0, zero by default),    λ_n = exp(log_decay_n)

with ``log_decay`` (N,) complex and constant over time and batch, ``inputs`` v of shape
(..., L, N) complex (time is the second-to-last axis, the state the last), and the states x of
the same shape returned. ``reverse=True`` runs it from the end: ``x_t = λ x_{t+1} + v_t``.

The package, one module per implementation beside what they share:

- :mod:`.common`: the arguments' checks;
- :mod:`.reference`: ``"ref"``, :func:`complex_diag_scan_ref`, the loop over time (slow and
  obviously correct; autograd through the loop);
- :mod:`.chunked`: ``"chunk"`` and ``"loop"``, the chunked scan (:func:`complex_diag_scan_chunk`,
  :func:`complex_diag_scan_loop`). The length is cut into chunks of T positions; the states
  inside every chunk from a zero start are computed for all chunks at once, either as one product
  with the (T x T) lower-triangular matrix of powers ``W[t, s] = λ^(t-s)`` (``"chunk"``: T·L·N
  multiply-adds per sequence, in large batched products) or by stepping through the T positions
  of all chunks together (``"loop"``: L·N multiply-adds in T sequential steps). The states at the
  chunk ends follow the same recurrence one level up (decay λ^T, input the chunk's last local
  state), solved the same way, and are carried into each chunk multiplied by λ^(t+1). Powers are
  computed as ``exp(k · log λ)``: for a stable recurrence (Re log λ <= 0) they are at most 1 in
  modulus and nothing overflows, however long the sequence;
- :mod:`.dispatch`: :func:`complex_diag_scan`, the entry point, which runs the implementation
  named by ``impl`` (:data:`IMPLS`; None: the default, :func:`set_default_impl`; ``"auto"``: see
  :func:`auto_impl`, ``"loop"`` on CPU tensors and ``"chunk"`` elsewhere) following the ops'
  dispatch convention (:mod:`longrange.ops.dispatch`), and reports it to
  :mod:`longrange.ops.used` (op ``"complex_diag_scan"``).

Gradients follow PyTorch's convention for complex tensors (for a real loss, the gradient of z is
dℓ/dRe z + i dℓ/dIm z). The chunked scan has a hand-written backward that is the same scan run
in reverse with the conjugate decay, ``g_t = grad_t + conj(λ) g_{t+1}``, giving
``grad v_t = g_t``, ``grad h0 = conj(λ) g_0`` and ``grad log λ = conj(λ) Σ_t conj(x_{t-1}) g_t``;
it keeps only the states (no per-chunk temporaries) and is not itself differentiable (no double
backward). Every implementation is deterministic wherever PyTorch's own operations are. (The real
scan :func:`longrange.ops.scan.linear_scan` takes a decay per position and element, and its
hand-written backward is for real tensors only.)
"""

from longrange.ops.complex_scan.chunked import DEFAULT_CHUNK_SIZE, complex_diag_scan_chunk, complex_diag_scan_loop
from longrange.ops.complex_scan.dispatch import (
    DETERMINISTIC_BACKWARD,
    DISPATCHER,
    IMPLS,
    auto_impl,
    available_impls,
    check_impl,
    complex_diag_scan,
    default_impl,
    set_default_impl,
)
from longrange.ops.complex_scan.reference import complex_diag_scan_ref

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DETERMINISTIC_BACKWARD",
    "DISPATCHER",
    "IMPLS",
    "auto_impl",
    "available_impls",
    "check_impl",
    "complex_diag_scan",
    "complex_diag_scan_chunk",
    "complex_diag_scan_loop",
    "complex_diag_scan_ref",
    "default_impl",
    "set_default_impl",
]
