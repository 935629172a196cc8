"""The selective scan with eigenvalues in [-1, 1]: :func:`selective_scan_signed`, and the diagonal
linear recurrence with decays of either sign it is built on, :func:`signed_linear_scan`.

Grazzi et al. 2025 ("Unlocking State-Tracking in Linear RNNs Through Negative Eigenvalues", arXiv
2411.12537) show that a diagonal recurrence whose decays lie in [0, 1], as Mamba's ``exp(delta A)``
do, cannot track parity, and extend the range to [-1, 1] with the decay ``2 exp(delta A) - 1``::

    h_t = (2 exp(delta_t A) - 1) * h_{t-1} + delta_t * B_t * u_t;    y_t = <C_t, h_t> + D * u_t

(the shapes and the rest of the semantics are the selective scan's, :mod:`longrange.ops.scan`).
A negative decay has no logarithm, so the log-space forms of the other implementations (the chunked
scan's segment sums, the kernels' ``exp`` of cumulated log-decays) do not apply. This one steps
through time: forward keeps every state, backward runs the recurrence in reverse
(:class:`_SignedScan`: ``dh_t = g_t + a_{t+1} dh_{t+1}``, ``da_t = dh_t h_{t-1}``), and the decays
and inputs of the recurrence, (l, b, d, n) tensors, are formed one segment of the length at a time
(at most ``segment`` positions), so that evaluation holds one segment's worth at once. Its ground
truth is :func:`~longrange.ops.scan.reference.selective_scan_ref` with ``negative_eigenvalues``.
It runs on every device; it is as fast as PyTorch's elementwise operations over (b, d, n) per
position, not a fused kernel.
"""

from __future__ import annotations

import torch
from torch import Tensor

from longrange.ops.scan.common import finish, loop_operands, shape_of

#: Positions whose decays and inputs are formed at once.
SEGMENT = 64


class _SignedScan(torch.autograd.Function):
    """``h_t = decay_t * h_{t-1} + inputs_t`` over the first axis, from ``h0``; any signs."""

    @staticmethod
    def forward(ctx, decay: Tensor, inputs: Tensor, h0: Tensor) -> Tensor:
        states = torch.empty_like(inputs)
        h = h0
        for t in range(inputs.shape[0]):
            h = torch.addcmul(inputs[t], decay[t], h)
            states[t] = h
        ctx.save_for_backward(decay, states, h0)
        return states

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        decay, states, h0 = ctx.saved_tensors
        g_inputs = torch.empty_like(grad)
        carry = torch.zeros_like(grad[0])
        for t in range(grad.shape[0] - 1, -1, -1):
            carry = grad[t] + carry
            g_inputs[t] = carry
            carry = carry * decay[t]  # what reaches h_{t-1}
        previous = torch.cat([h0[None], states[:-1]])
        return g_inputs * previous, g_inputs, carry


def signed_linear_scan(decay: Tensor, inputs: Tensor, h0: Tensor | None = None) -> Tensor:
    """All states of ``h_t = decay_t * h_{t-1} + inputs_t`` (decays of any sign), time-major:
    ``decay``, ``inputs`` (L, ...) of one shape, ``h0`` (...) or None for zeros. Differentiable in
    all three."""
    if decay.shape != inputs.shape or decay.dim() < 1:
        raise ValueError(f"signed_linear_scan: decay {shape_of(decay)} and inputs {shape_of(inputs)} differ in shape")
    if h0 is None:
        h0 = inputs.new_zeros(inputs.shape[1:])
    elif h0.shape != inputs.shape[1:]:
        raise ValueError(f"signed_linear_scan: h0 must have shape {shape_of(inputs)[1:]}, got {shape_of(h0)}")
    return _SignedScan.apply(decay, inputs, h0)


def selective_scan_signed(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    delta_bias: Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    initial_state: Tensor | None = None,
    segment: int = SEGMENT,
) -> Tensor | tuple[Tensor, Tensor]:
    """The selective scan with decays ``2 exp(delta A) - 1`` (see the module docstring); the
    arguments and shapes of :func:`~longrange.ops.scan.selective_scan`."""
    if segment < 1:
        raise ValueError(f"selective_scan_signed: segment must be >= 1, got {segment}")
    uc, dt, Ac, Bc, Cc, h = loop_operands(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state)
    b, d, l = u.shape
    ys = []
    for s in range(0, l, segment):
        part = slice(s, min(l, s + segment))
        dt_p = dt[:, :, part].permute(2, 0, 1)[..., None]  # (t, b, d, 1)
        decay = 2 * torch.exp(dt_p * Ac) - 1
        inputs = (dt_p * uc[:, :, part].permute(2, 0, 1)[..., None]) * Bc[..., part].permute(3, 0, 1, 2)
        states = signed_linear_scan(decay, inputs, h)
        ys.append(torch.einsum("tbdn,bdnt->bdt", states, Cc[..., part]))
        h = states[-1]
    y = torch.cat(ys, dim=-1) if ys else uc.new_zeros(b, d, 0)
    out = finish(y, uc, D, z, u.dtype)
    return (out, h) if return_last_state else out


__all__ = ["SEGMENT", "selective_scan_signed", "signed_linear_scan"]
