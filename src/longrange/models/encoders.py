"""Input encoders: token embeddings and linear maps of numeric channels, with optional positions."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from longrange.errors import ConfigError
from longrange.ops.dataless import holds_data


def sinusoidal_positions(length: int, d: int, device=None, dtype=None) -> Tensor:
    """The fixed sinusoidal position table of the original Transformer, (length, d)."""
    pos = torch.arange(length, device=device, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(torch.arange(0, d, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / d))
    table = torch.zeros(length, d, device=device, dtype=torch.float32)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: d // 2])
    return table.to(dtype or torch.float32)


class PositionalEmbedding(nn.Module):
    """Adds absolute positions: "none", "learned" (up to ``max_len``) or "sinusoidal"."""

    def __init__(self, kind: str, d_model: int, max_len: int = 0):
        super().__init__()
        self.kind = kind
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model) if kind == "learned" else None

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        if self.kind == "none":
            return x
        length = x.shape[1]
        if self.kind == "learned":
            if offset + length > self.max_len:
                raise ValueError(
                    f"input of length {offset + length} exceeds the learned position table (model.max_len = {self.max_len})"
                )
            positions = torch.arange(offset, offset + length, device=x.device)
            return x + self.table(positions)
        return x + sinusoidal_positions(offset + length, x.shape[-1], x.device, x.dtype)[offset:]


class TokenEncoder(nn.Module):
    """Token ids (batch, length) -> embeddings (batch, length, d_model)."""

    input_kind = "tokens"

    def __init__(self, vocab_size: int, d_model: int, pos_embedding: str = "none", max_len: int = 0):
        super().__init__()
        if vocab_size < 1:
            raise ConfigError(f"a token encoder needs a vocabulary size, got {vocab_size}")
        self.vocab_size = vocab_size
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.positions = PositionalEmbedding(pos_embedding, d_model, max_len)

    def forward(self, inputs: Tensor, offset: int = 0) -> Tensor:
        if inputs.dim() != 2 or inputs.is_floating_point():
            raise ValueError(
                f"token inputs must be integer ids of shape (batch, length), got {inputs.dtype} {tuple(inputs.shape)}"
            )
        # The range is checked where it is free: on CPU tensors with data, in eager mode. Ids without
        # data (dry runs) have none; a compiled model would split its graph at a check by value; on an
        # accelerator, reading a value back would stall every step. There the ids come from the task's
        # vocabulary, which the model was built with, and an id out of range is the embedding's
        # index error.
        if inputs.numel() and inputs.device.type == "cpu" and holds_data(inputs) and not torch.compiler.is_compiling():
            low, high = (int(v) for v in torch.aminmax(inputs))
            if low < 0 or high >= self.vocab_size:
                bad = low if low < 0 else high
                raise ValueError(f"token id {bad} is outside the vocabulary of size {self.vocab_size}")
        return self.positions(self.embedding(inputs), offset)


class NumericEncoder(nn.Module):
    """Numeric inputs (batch, length, d_input) -> (batch, length, d_model) by a linear map.

    With ``mask_channel`` the encoder expects one extra input channel, the mask indicator of
    masked pretraining; :meth:`drop_mask_channel` removes it for finetuning.
    """

    input_kind = "numeric"

    def __init__(
        self, d_input: int, d_model: int, mask_channel: bool = False, pos_embedding: str = "none", max_len: int = 0
    ):
        super().__init__()
        self.d_input = d_input
        self.mask_channel = mask_channel
        self.linear = nn.Linear(d_input + int(mask_channel), d_model)
        self.positions = PositionalEmbedding(pos_embedding, d_model, max_len)

    @property
    def in_features(self) -> int:
        return self.linear.in_features

    def forward(self, inputs: Tensor, offset: int = 0) -> Tensor:
        if inputs.dim() != 3 or inputs.shape[-1] != self.in_features:
            extra = " (the last is the mask indicator)" if self.mask_channel else ""
            raise ValueError(
                f"numeric inputs must have shape (batch, length, {self.in_features}){extra}, got {tuple(inputs.shape)}"
            )
        return self.positions(self.linear(inputs), offset)

    @torch.no_grad()
    def drop_mask_channel(self) -> None:
        """Remove the mask-indicator input column (pretraining -> finetuning)."""
        if not self.mask_channel:
            return
        old = self.linear
        new = nn.Linear(self.d_input, old.out_features, device=old.weight.device, dtype=old.weight.dtype)
        new.weight.copy_(old.weight[:, : self.d_input])
        new.bias.copy_(old.bias)
        self.linear = new
        self.mask_channel = False
