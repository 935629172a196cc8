"""RWKV-4's WKV: a per-channel decaying weighted average of values, with a bonus for the current token.

Shapes: ``k``, ``v`` (batch, length, channels); ``w``, ``u`` (channels,). Per channel, with the
decay rate ``w > 0`` (the layer passes ``exp(time_decay)``) and the bonus ``u`` (``time_first``)::

    y_t = (Σ_{i<t} exp(k_i - (t-1-i) w) v_i + exp(u + k_t) v_t)
          / (Σ_{i<t} exp(k_i - (t-1-i) w)     + exp(u + k_t))

(Peng et al., "RWKV: Reinventing RNNs for the Transformer Era", arXiv 2305.13048, eq. 14; the
token at t-1 enters undecayed, as BlinkDL/RWKV-LM's v4 kernel and Zoology's copy of it compute.)

The state after position t is the numerator and denominator of the sums over i <= t, kept as
``{"num", "den", "scale"}`` (each (batch, channels)) with the sums equal to ``exp(scale) * num``
and ``exp(scale) * den``: the log-scale keeps every exponential at most 1 whatever the keys (the
v4 kernel's running maximum), so nothing overflows in float32. The empty state has scale -inf.

The package, one module per implementation, each tested against the loop:

- :mod:`.reference`: ``"ref"``, :func:`wkv_ref`, the sums as written, a loop over time
  accumulating them unscaled (in float64 the ground truth, keys up to a few hundred); and
  :func:`wkv_step`, one position by the v4 kernel's scaled recurrence, for generation;
- :mod:`.chunked`: ``"chunked"``, both sums as one diagonal linear scan in PyTorch at their running
  maximum (any device; an initial state and the final one);
- :mod:`.numba`: ``"numba"``, compiled loops for CPUs, forward and backward (from an empty state);
- :mod:`.dispatch`: :func:`wkv`, which runs the one named by ``impl`` (its :data:`DISPATCHER`
  follows the convention of :mod:`longrange.ops.dispatch`; ``"auto"``: numba on CPU tensors where
  it imports and no state is used, else chunked).

Computation runs in the wider of the inputs' dtype and float32.
"""

from longrange.ops.wkv.dispatch import (
    DETERMINISTIC_BACKWARD,
    DISPATCHER,
    IMPLS,
    auto_impl,
    available_impls,
    default_impl,
    set_default_impl,
    wkv,
)
from longrange.ops.wkv.reference import STATE_KEYS, check_state, empty_state, wkv_ref, wkv_step

__all__ = [
    "DETERMINISTIC_BACKWARD",
    "DISPATCHER",
    "IMPLS",
    "STATE_KEYS",
    "auto_impl",
    "available_impls",
    "check_state",
    "default_impl",
    "empty_state",
    "set_default_impl",
    "wkv",
    "wkv_ref",
    "wkv_step",
]
