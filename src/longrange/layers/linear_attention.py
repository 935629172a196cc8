"""Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs", arXiv 2006.16236) with the
feature maps of MAD's linear attention (athms/mad-lab ``mad/model/layers/attention_linear.py``) and
of Based (Arora et al. 2024, arXiv 2402.18668; HazyResearch/zoology ``zoology/mixers/based.py``), as
a sequence primitive.

Per head (H heads; keys of ``feature_dim`` f features, values of d_v = ``expand_v`` · d / H)::

    q, k, v = q_proj(x), k_proj(x), v_proj(x)          # no bias
    S_t = S_{t-1} + φ_k(k_t)^T v_t,   z_t = z_{t-1} + φ_k(k_t)
    o_t = φ_q(q_t) S_t / (φ_q(q_t) · z_t + eps)          # normalize=True; otherwise φ_q(q_t) S_t
    out = o_proj(o)                                       # no bias

computed by :func:`longrange.ops.matrix_state.gla` with no decay (all log-gates 0, scale 1): the
normaliser z is one more value column, of ones, so the state per head is F x (d_v + 1) for a map
of F features (F x d_v without the normaliser). The feature maps (``feature_map``):

* ``identity``: φ(x) = x (F = f);
* ``elu``: elu(x) + 1; ``relu``: max(x, 0) (F = f);
* ``hadamard`` (MAD's ``elementwise_product``): φ(x) = (W_1 x + b_1) ⊙ (W_2 x + b_2), two
  (f x f) linear layers with biases shared by the heads, one such map for queries and another
  for keys unless ``tie_feature_map`` (F = f). Its features can be negative, so the normaliser
  can approach 0 (MAD's layer, kept as published);
* ``taylor`` (Based's ``taylor_exp``): the second-order Taylor expansion of exp(q·k / √f),
  φ(q) · φ(k) = 1 + q·k / √f + (q·k)² / (2f), always positive. Based's forward pass writes the
  quadratic part as all f² products x_i x_j / (√2 √f); here it is the f (f + 1) / 2 distinct ones
  (x_i² / (√2 √f) and x_i x_j / √f for i > j: the same dot products, the form that Zoology's
  ``state_size`` counts), so F = 1 + f + f (f + 1) / 2.

Defaults: one head, f = d / H, d_v = d / H, the ``elu`` map (Katharopoulos et al.), normalised with
eps 1e-12 (MAD's and Based's). MAD's ``linear-attention`` and ``mh-linear-attention``
(``configs/layers/*.yml``) are the ``hadamard`` map with 1 and 16 heads; Based's linear attention
is ``taylor`` with f = 16 (its ``feature_dim``), which Based stacks with short gated convolutions
(Zoology's BaseConv: :mod:`longrange.layers.base_conv`) and, in its language models, with
sliding-window attention.

Bidirectional (``bidirectional=True``): two causal layers, one over the reversed sequence, summed
(as GLA). Step mode: the state S (with z) per head; ``step`` == ``forward``.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longrange.errors import ConfigError
from longrange.layers.mixer_parts import QKVMixer, check_heads, split_heads
from longrange.layers.registry import register_primitive
from longrange.layers.ssm import check_choice, check_positive_int
from longrange.ops.matrix_state import dispatch as matrix_state

#: The feature maps (see the module docstring).
FEATURE_MAPS = ("identity", "elu", "relu", "hadamard", "taylor")

_WHERE = "linear attention"


def taylor_features(x: Tensor) -> Tensor:
    """Based's second-order Taylor features of x (..., f), in their distinct form (..., 1 + f +
    f (f + 1) / 2): φ(x) · φ(y) = 1 + x·y / √f + (x·y)² / (2f). The products x_i x_j (i >= j, in
    the order of ``torch.tril_indices``) are formed row by row, one broadcast product each: a gather
    along the last dimension (``index_select``) ran ten times slower on CPUs."""
    f = x.shape[-1]
    rows, cols = torch.tril_indices(f, f, device=x.device)  # i >= j, the diagonal included
    weight = torch.where(rows == cols, 1 / math.sqrt(2 * f), 1 / math.sqrt(f)).to(x.dtype)
    quadratic = torch.cat([x[..., i : i + 1] * x[..., : i + 1] for i in range(f)], dim=-1) * weight
    return torch.cat([torch.ones_like(x[..., :1]), x / f**0.25, quadratic], dim=-1)


def feature_size(feature_map: str, f: int) -> int:
    """F, the number of features the map gives for keys of f features."""
    return 1 + f + f * (f + 1) // 2 if feature_map == "taylor" else f


class HadamardMap(nn.Module):
    """MAD's ``HadamardFeatureMap``: (W_1 x + b_1) ⊙ (W_2 x + b_2) over the last dimension."""

    def __init__(self, f: int):
        super().__init__()
        self.layer1, self.layer2 = nn.Linear(f, f), nn.Linear(f, f)

    def forward(self, x: Tensor) -> Tensor:
        return self.layer1(x) * self.layer2(x)


@register_primitive("linear-attention")
class LinearAttention(QKVMixer):
    """Linear attention with a feature map (see the module docstring)."""

    OPTION_NOTES: ClassVar[dict[str, str]] = {
        "feature_dim": "d_model / n_heads",
        "chunk_size": "the GLA op's (chunked form: on a CPU 16 for feature widths up to 32, else 64)",
        "impl": 'the op\'s default for the process: "auto" unless changed by its set_default_impl',
    }

    def __init__(
        self,
        d_model: int,
        n_heads: int = 1,
        feature_dim: int | None = None,
        expand_v: float = 1.0,
        feature_map: str = "elu",
        tie_feature_map: bool = False,
        normalize: bool = True,
        eps: float = 1e-12,
        chunk_size: int | None = None,
        bidirectional: bool = False,
        impl: str | None = None,
    ):
        super().__init__()
        check_positive_int("d_model", d_model, where=_WHERE)
        check_positive_int("n_heads", n_heads, where=_WHERE)
        if feature_dim is None:
            feature_dim = check_heads(_WHERE, d_model, n_heads, "d_model =")
        check_positive_int("feature_dim", feature_dim, where=_WHERE)
        if chunk_size is not None:
            check_positive_int("chunk_size", chunk_size, where=_WHERE)
        check_choice("feature_map", feature_map, FEATURE_MAPS, where=_WHERE)
        value_dim = int(d_model * expand_v)
        if value_dim < 1:
            raise ConfigError(f"{_WHERE}: expand_v must give a positive value width, got {value_dim}")
        dv = check_heads(_WHERE, value_dim, n_heads, "the value width expand_v * d_model =")
        if not eps >= 0:
            raise ConfigError(f"{_WHERE}: eps must be >= 0, got {eps!r}")
        matrix_state.check_impl("gla", impl, _WHERE)
        self.d_model, self.n_heads, self.f, self.feature_map = d_model, n_heads, feature_dim, feature_map
        self.key_dim, self.value_dim, self.values = feature_dim * n_heads, value_dim, dv
        self.normalize, self.eps = bool(normalize), float(eps)
        self.chunk_size, self.impl = chunk_size, impl
        self.bidirectional = bool(bidirectional)
        # the recurrence's widths per head: F features by d_v values (and the normaliser's column)
        self.dk, self.dv = feature_size(feature_map, feature_dim), dv + int(self.normalize)
        kwargs = dict(
            n_heads=n_heads,
            feature_dim=feature_dim,
            expand_v=expand_v,
            feature_map=feature_map,
            tie_feature_map=tie_feature_map,
            normalize=normalize,
            eps=eps,
            chunk_size=chunk_size,
            impl=impl,
        )
        if self._init_directions((lambda: LinearAttention(d_model, **kwargs)) if self.bidirectional else None):
            return
        self.q_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, value_dim, bias=False)
        self.conv, self.g_proj, self.norm = None, None, None
        if feature_map == "hadamard":
            self.map_q = HadamardMap(feature_dim)
            self.map_k = self.map_q if tie_feature_map else HadamardMap(feature_dim)
        self.o_proj = nn.Linear(value_dim, d_model, bias=False)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, heads={self.n_heads}, feature_dim={self.f}, features={self.dk}, "
            f"d_v={self.values}, feature_map={self.feature_map}, normalize={self.normalize}, "
            f"bidirectional={self.bidirectional}"
        )

    def _features(self, x: Tensor, which: str) -> Tensor:
        if self.feature_map == "hadamard":
            return (self.map_q if which == "q" else self.map_k)(x)
        if self.feature_map == "elu":
            return F.elu(x) + 1
        if self.feature_map == "relu":
            return F.relu(x)
        if self.feature_map == "taylor":
            return taylor_features(x)
        return x

    def _heads(self, qkv: Tensor, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        q, k, v = qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        h = self.n_heads
        q, k, v = self._features(split_heads(q, h), "q"), self._features(split_heads(k, h), "k"), split_heads(v, h)
        if self.normalize:  # the normaliser as a column of ones: its state column is z
            v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
        return q, k, v, torch.zeros_like(k)

    def _recur(self, heads: tuple[Tensor, ...], mask: Tensor | None) -> Tensor:
        return matrix_state.gla(*heads, scale=1.0, mask=mask, chunk_size=self.chunk_size, impl=self.impl)

    def _recur_step(self, heads: tuple[Tensor, ...], S: Tensor) -> tuple[Tensor, Tensor]:
        return matrix_state.gla_step(*heads, S, scale=1.0)

    def _out(self, o: Tensor, x: Tensor) -> Tensor:
        if self.normalize:
            o = o[..., :-1] / (o[..., -1:] + self.eps)
        return self.o_proj(o.flatten(-2))
