"""Mixed precision: the autocast context of the forward passes, and the loss scaling of fp16.

    precision = Precision("bf16", device)
    with precision.autocast():
        loss = objective(model, batch).loss
    precision.backward(loss)
    precision.step(optimizer, model.parameters(), grad_clip=1.0)

``fp32`` runs as is; ``bf16`` autocasts to bfloat16 (CPU or CUDA); ``fp16`` autocasts to float16 with
a gradient scaler (CUDA only), whose state is saved in checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import Tensor

from longrange.errors import ConfigError

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    def __init__(self, precision: str, device: torch.device):
        if precision not in DTYPES:
            raise ConfigError(f"train.precision must be one of {', '.join(DTYPES)}, got {precision!r}")
        if precision == "fp16" and device.type != "cuda":
            raise ConfigError(
                f"train.precision 'fp16' needs a CUDA device (it uses a GradScaler); this run is on "
                f"{device.type}: use 'bf16' or 'fp32'"
            )
        self.name = precision
        self.device = device
        self.dtype = DTYPES[precision]
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None

    def autocast(self) -> AbstractContextManager[Any]:
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def backward(self, loss: Tensor) -> None:
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def step(self, optimizer: torch.optim.Optimizer, parameters: Iterable[Tensor], grad_clip: float = 0.0) -> None:
        """Clip the gradients' norm to ``grad_clip`` (0: no clipping) and take the optimiser step."""
        if self.scaler is None:
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(parameters, grad_clip)
            optimizer.step()
            return
        if grad_clip > 0:
            self.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(parameters, grad_clip)
        self.scaler.step(optimizer)
        self.scaler.update()

    def state_dict(self) -> dict[str, Any] | None:
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.scaler is not None and state is not None:
            self.scaler.load_state_dict(state)
