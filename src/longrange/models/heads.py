"""Output heads and the pooling that respects padding.

Pooled heads (classification, regression) end in ``head_layers`` linear maps: 1 = a linear map,
2 = an MLP ``Linear(d, hidden) -> activation -> Linear(hidden, n_out)``, 3 = LRA's
``Linear(d, hidden) -> activation -> Linear(hidden, hidden // 2) -> activation -> Linear``. The
retrieval head is the S4/SPT head (two layers on ``[a, b, a*b, a-b]``) for 1 and 2, and LRA's
dual head (three layers on ``[a, b]``) for 3.

Heads are registered by kind (:data:`longrange.models.registry.HEADS`) and built as
``cls(d_model, n_out, **options)``, the model's ``pooling`` going to the heads that take it. A
head reads the backbone's features of one sequence, ``head(h, mask, cls_index)``, or, with
``two_sequences = True``, of two: ``head(h1, mask1, h2, mask2, cls1, cls2)``. A head with
``per_position = True`` gives an output per position (it can generate step by step, and needs no
CLS vector).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from longrange.blocks.norms import RMSNorm
from longrange.errors import ConfigError
from longrange.models.config import HEAD_LAYERS, POOLINGS
from longrange.models.registry import register_head

HEAD_ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU}


def pool(h: Tensor, mask: Tensor | None, pooling: str, cls_index: Tensor | None = None) -> Tensor:
    """Pool features h (batch, length, d) over real positions -> (batch, d).

    "mean": the mean over real positions; "last": the last real position; "max": the maximum
    over real positions, per feature (padded positions never win; a sequence without real
    positions pools to 0); "cls": the position ``cls_index`` (batch,) where the model placed its
    CLS vector. ``mask`` (batch, length) is True at real positions; None = all real.
    """
    if pooling == "mean":
        if mask is None:
            return h.mean(1)
        w = mask.to(h.dtype).unsqueeze(-1)
        return (h * w).sum(1) / w.sum(1).clamp_min(1.0)
    if pooling == "last":
        if mask is None:
            return h[:, -1]
        index = mask.long().sum(1).clamp_min(1) - 1
        return h[torch.arange(h.shape[0], device=h.device), index]
    if pooling == "max":
        if mask is None:
            return h.amax(1)
        real = mask.unsqueeze(-1)
        top = h.masked_fill(~real, float("-inf")).amax(1)
        return torch.where(real.any(1), top, torch.zeros_like(top))
    if pooling == "cls":
        if cls_index is None:
            raise ValueError("cls pooling needs the CLS position")
        return h[torch.arange(h.shape[0], device=h.device), cls_index]
    raise ConfigError(f"unknown pooling {pooling!r}; expected {', '.join(POOLINGS)}")


def mlp(d_in: int, n_out: int, layers: int = 1, hidden: int | None = None, activation: str = "gelu") -> nn.Module:
    """``layers`` = 1: Linear(d_in, n_out); 2: Linear(d_in, hidden) -> activation -> Linear(hidden, n_out);
    3: Linear(d_in, hidden) -> activation -> Linear(hidden, hidden // 2) -> activation -> Linear(hidden // 2,
    n_out) (LRA's ``classifier_head_dual``: Dense(mlp_dim), Dense(mlp_dim // 2), Dense). ``hidden``: d_in if None."""
    if layers == 1:
        return nn.Linear(d_in, n_out)
    if layers not in HEAD_LAYERS:
        raise ConfigError(f"model.head_layers must be 1 (linear), 2 (MLP) or 3 (LRA's three-layer MLP), got {layers!r}")
    if activation not in HEAD_ACTIVATIONS:
        raise ConfigError(f"model.head_activation {activation!r} is not one of {', '.join(HEAD_ACTIVATIONS)}")
    hidden = hidden or d_in
    if layers == 2:
        return nn.Sequential(nn.Linear(d_in, hidden), HEAD_ACTIVATIONS[activation](), nn.Linear(hidden, n_out))
    if hidden < 2:
        raise ConfigError(
            f"model.head_hidden must be >= 2 for head_layers 3 (its second layer has hidden // 2), got {hidden}"
        )
    half = hidden // 2
    return nn.Sequential(
        nn.Linear(d_in, hidden),
        HEAD_ACTIVATIONS[activation](),
        nn.Linear(hidden, half),
        HEAD_ACTIVATIONS[activation](),
        nn.Linear(half, n_out),
    )


@register_head("classify")
@register_head("regress")
class PooledHead(nn.Module):
    """Pool, then a linear map (``layers=1``, parameters ``linear.*``) or an MLP (``layers=2``,
    parameters ``mlp.*``) to ``n_out`` (class logits, or regression targets)."""

    def __init__(
        self,
        d_model: int,
        n_out: int,
        pooling: str = "mean",
        layers: int = 1,
        hidden: int | None = None,
        activation: str = "gelu",
    ):
        super().__init__()
        self.pooling = pooling
        out = mlp(d_model, n_out, layers, hidden, activation)
        # One linear map keeps its historical name, so older checkpoints load.
        if layers == 1:
            self.linear = out
        else:
            self.mlp = out

    def forward(self, h: Tensor, mask: Tensor | None, cls_index: Tensor | None = None) -> Tensor:
        out = self.linear if hasattr(self, "linear") else self.mlp
        return out(pool(h, mask, self.pooling, cls_index))


@register_head("retrieval")
class RetrievalHead(nn.Module):
    """Two-sequence classification on pooled features a, b of one shared backbone (two towers).

    ``layers`` 1 or 2 (the default): the S4 and SPT code's head, ``Linear(4d, hidden) -> activation
    -> Linear(hidden, n_classes)`` on ``[a, b, a·b, a−b]``; 3: LRA's ``classifier_head_dual``
    (without its NLI interaction, which LRA's matching task leaves off), ``Linear(2d, hidden) ->
    activation -> Linear(hidden, hidden // 2) -> activation -> Linear(hidden // 2, n_classes)`` on
    ``[a, b]``. ``hidden`` = d by default.
    """

    two_sequences = True

    def __init__(
        self,
        d_model: int,
        n_classes: int,
        pooling: str = "mean",
        hidden: int | None = None,
        activation: str = "gelu",
        layers: int = 1,
    ):
        super().__init__()
        self.pooling = pooling
        self.interaction = layers != 3
        if layers == 3:
            self.mlp = mlp(2 * d_model, n_classes, 3, hidden or d_model, activation)
        else:
            self.mlp = mlp(4 * d_model, n_classes, 2, hidden or d_model, activation)

    def forward(
        self,
        h1: Tensor,
        mask1: Tensor | None,
        h2: Tensor,
        mask2: Tensor | None,
        cls1: Tensor | None = None,
        cls2: Tensor | None = None,
    ) -> Tensor:
        a = pool(h1, mask1, self.pooling, cls1)
        b = pool(h2, mask2, self.pooling, cls2)
        features = [a, b, a * b, a - b] if self.interaction else [a, b]
        return self.mlp(torch.cat(features, dim=-1))


def sincos_positions(length: int, dim: int, device=None, dtype=None) -> Tensor:
    """Sinusoidal position embeddings (length, dim) as fairseq writes them and mad-lab's
    ``posemb_sincos_1d`` copies: sines then cosines of ``position * 10000^(-i / (dim/2 - 1))``,
    a zero column for odd ``dim``."""
    half = dim // 2
    rate = math.log(10000) / max(half - 1, 1)
    angle = torch.arange(length, dtype=torch.float32)[:, None] * torch.exp(torch.arange(half) * -rate)[None, :]
    emb = torch.cat([torch.sin(angle), torch.cos(angle), torch.zeros(length, dim % 2)], dim=1)
    return emb.to(device=device, dtype=dtype)


@register_head("decode-last")
class LastPositionDecoder(nn.Module):
    """Every position's output decoded from the last real position alone: MAD's autoencoder head
    (athms/mad-lab ``mad/model/auto_encoder.py``, the backbone it uses for its compression task).

    The features at the last real position (b, d) plus a sinusoidal embedding of each position
    (:func:`sincos_positions`) go through MAD's "non-expanding MLP decoder", ``RMSNorm -> Linear(d, d)
    -> GELU -> RMSNorm -> Linear(d, d) -> GELU``, then ``RMSNorm -> Linear(d, n_out)``: logits
    (b, l, n_out) at every position, none of which can read its own input token. The sequence
    layers run as the model's (mad-lab pools the last position of its own residual stream, without
    the final norm the toolkit's backbone applies). It has no recurrent step: it needs the whole
    sequence's last position before its first output."""

    per_position = True
    #: Reads the whole sequence (its last position), not each position's own features.
    reads_sequence = True

    def __init__(self, d_model: int, n_out: int):
        super().__init__()
        self.decoder = nn.Sequential(
            RMSNorm(d_model),
            nn.Linear(d_model, d_model),
            nn.GELU(),
            RMSNorm(d_model),
            nn.Linear(d_model, d_model),
            nn.GELU(),
        )
        self.unembed = nn.Sequential(RMSNorm(d_model), nn.Linear(d_model, n_out))

    def forward(self, h: Tensor, mask: Tensor | None = None, cls_index: Tensor | None = None) -> Tensor:
        b, length, d = h.shape
        last = (
            torch.full((b,), length - 1, device=h.device, dtype=torch.long)
            if mask is None
            else mask.long().sum(dim=1).clamp(min=1) - 1
        )
        code = h[torch.arange(b, device=h.device), last]  # (b, d)
        x = code[:, None, :] + sincos_positions(length, d, h.device, h.dtype)[None]
        return self.unembed(self.decoder(x))


@register_head("tokens")
class TokenHead(nn.Module):
    """A per-position linear map: next-token/masked-token logits, intensity classes or values."""

    per_position = True

    def __init__(self, d_model: int, n_out: int):
        super().__init__()
        self.linear = nn.Linear(d_model, n_out)

    def forward(self, h: Tensor, mask: Tensor | None = None, cls_index: Tensor | None = None) -> Tensor:
        return self.linear(h)
