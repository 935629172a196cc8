"""The selective scan as a plain loop over time: :func:`selective_scan_ref`, the reference every
other implementation is tested against (slow and obviously correct; see the package docstring for
the shapes and the recurrence).

Its backward is PyTorch's autograd through elementwise operations and sums, so it is
deterministic wherever PyTorch's own operations are.
"""

from __future__ import annotations

import torch
from torch import Tensor

from longrange.ops.scan.common import check_shapes, compute_dtype, finish, per_channel, prepare_delta


def selective_scan_ref(
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
    negative_eigenvalues: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """The selective scan as a sequential loop over time (the reference). See the module docstring.

    ``negative_eigenvalues``: the decay is ``2 exp(delta A) - 1``, in (-1, 1] (Grazzi et al. 2025's
    eigenvalue range [-1, 1]; :mod:`longrange.ops.scan.signed`), instead of ``exp(delta A)``."""
    check_shapes(u, delta, A, B, C, D, z, delta_bias, initial_state)
    dtype = compute_dtype(u, delta, A, B, C, D, z, delta_bias, initial_state)
    b, d, l = u.shape
    n = A.shape[1]
    uc = u.to(dtype)
    dt = prepare_delta(delta, delta_bias, delta_softplus, dtype)
    Ac = A.to(dtype)
    Bc = per_channel(B.to(dtype), d).expand(b, d, n, l)
    Cc = per_channel(C.to(dtype), d).expand(b, d, n, l)
    h = torch.zeros(b, d, n, dtype=dtype, device=u.device) if initial_state is None else initial_state.to(dtype)
    ys = []
    for t in range(l):
        decay = torch.exp(dt[:, :, t, None] * Ac)
        if negative_eigenvalues:
            decay = 2 * decay - 1
        h = decay * h + (dt[:, :, t] * uc[:, :, t])[:, :, None] * Bc[..., t]
        ys.append((h * Cc[..., t]).sum(-1))
    y = torch.stack(ys, dim=-1) if ys else uc.new_zeros(b, d, 0)
    out = finish(y, uc, D, z, u.dtype)
    return (out, h) if return_last_state else out
