"""``impl="ref"``: the complex diagonal scan by a loop over time (the ground truth; see the
package docstring)."""

from __future__ import annotations

import torch
from torch import Tensor

from longrange.ops.complex_scan.common import check_inputs


def complex_diag_scan_ref(log_decay: Tensor, inputs: Tensor, h0: Tensor | None = None, reverse: bool = False) -> Tensor:
    """All states of ``x_t = exp(log_decay) * x_{t-1} + inputs_t`` by a loop over time; backward by
    autograd through the loop."""
    check_inputs(log_decay, inputs, h0, "complex_diag_scan_ref")
    lam = torch.exp(log_decay)
    L = inputs.shape[-2]
    order = range(L - 1, -1, -1) if reverse else range(L)
    x = torch.zeros_like(inputs[..., 0, :]) if h0 is None else h0
    out: list[Tensor] = [x] * L
    for t in order:
        x = lam * x + inputs[..., t, :]
        out[t] = x
    return torch.stack(out, dim=-2) if L else inputs.clone()
