"""The selective scan as a plain loop over time: :func:`selective_scan_ref`, the reference every
other implementation is tested against (slow and obviously correct; see the package docstring for
the shapes and the recurrence).

Its backward is PyTorch's autograd through elementwise operations and sums, so it is
deterministic wherever PyTorch's own operations are.
"""

from __future__ import annotations

import torch
from torch import Tensor

from longrange.ops.scan.common import finish, loop_operands


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
    uc, dt, Ac, Bc, Cc, h = loop_operands(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state)
    b, d, l = u.shape
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
