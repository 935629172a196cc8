"""Gated Linear Attention (Yang et al. 2023, arXiv 2312.06635) as a sequence primitive.

The layer as flash-linear-attention's ``fla/layers/gla.py`` builds it (H heads; key width
``expand_k · d_model``, value width ``expand_v · d_model``, split evenly over the heads)::

    q, k, v = q_proj(x), k_proj(x), v_proj(x)              # no bias; optional short SiLU convolutions
    g = logsigmoid(W2 W1 x + b) / gate_logit_normalizer    # low-rank (rank 16) gate of the key width, <= 0
    S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t;  o_t = q_t S_t / sqrt(d_k)      (per head, S: d_k x d_v)
    out = o_proj(RMSNorm(o) · SiLU(g_proj(x)))            # the head-wise norm gated by the output gate

computed by :func:`longrange.ops.matrix_state.gla`. Defaults are the published ones (expand_k
0.5, expand_v 1, gate rank 16, normaliser 16, no short convolution, output gate on); the heads
come from ``model.n_heads``. GLA is a whole attention-like layer: use it in ``block: residual``
with an MLP (``model.mlp: swiglu``), as FLA's GLA models stack it.
"""

from __future__ import annotations

from typing import ClassVar

import torch.nn.functional as F
from torch import Tensor, nn

from longrange.errors import ConfigError
from longrange.layers.mixer_parts import HeadNorm, QKVMixer, ShortConv, check_heads, split_heads
from longrange.layers.registry import register_primitive
from longrange.layers.ssm import check_positive_int
from longrange.ops.matrix_state import dispatch as matrix_state


@register_primitive("gla")
class GLA(QKVMixer):
    """The gated linear attention layer (see the module docstring)."""

    OPTION_NOTES: ClassVar[dict[str, str]] = {
        "clamp_min": "the log-decays not clamped",
        "chunk_size": "chunked form: on a CPU 16 for key widths up to 32, else 64; other devices 64 "
        "(numba: positions between its backward's checkpoints, as many states as its buffer holds)",
        "impl": 'the op\'s default for the process: "auto" unless changed by its set_default_impl',
    }

    def __init__(
        self,
        d_model: int,
        n_heads: int = 4,
        expand_k: float = 0.5,
        expand_v: float = 1.0,
        gate_low_rank_dim: int = 16,
        gate_logit_normalizer: float = 16.0,
        clamp_min: float | None = None,
        use_short_conv: bool = False,
        conv_size: int = 4,
        use_output_gate: bool = True,
        norm_eps: float = 1e-5,
        chunk_size: int | None = None,
        bidirectional: bool = False,
        impl: str | None = None,
    ):
        super().__init__()
        where = "GLA"
        for name, value in (
            ("d_model", d_model),
            ("gate_low_rank_dim", gate_low_rank_dim),
            ("conv_size", conv_size),
            *([("chunk_size", chunk_size)] if chunk_size is not None else []),
        ):
            check_positive_int(name, value, where=where)
        key_dim, value_dim = int(d_model * expand_k), int(d_model * expand_v)
        if key_dim < 1 or value_dim < 1:
            raise ConfigError(
                f"{where}: expand_k and expand_v must give positive widths, got {key_dim} and {value_dim}"
            )
        self.dk = check_heads(where, key_dim, n_heads, "the key width expand_k * d_model =")
        self.dv = check_heads(where, value_dim, n_heads, "the value width expand_v * d_model =")
        if not gate_logit_normalizer > 0:
            raise ConfigError(f"{where}: gate_logit_normalizer must be positive, got {gate_logit_normalizer!r}")
        matrix_state.check_impl("gla", impl, where)
        self.d_model, self.n_heads, self.key_dim, self.value_dim = d_model, n_heads, key_dim, value_dim
        self.gate_logit_normalizer, self.clamp_min = float(gate_logit_normalizer), clamp_min
        self.chunk_size, self.impl = chunk_size, impl
        self.bidirectional = bool(bidirectional)
        kwargs = dict(
            n_heads=n_heads,
            expand_k=expand_k,
            expand_v=expand_v,
            gate_low_rank_dim=gate_low_rank_dim,
            gate_logit_normalizer=gate_logit_normalizer,
            clamp_min=clamp_min,
            use_short_conv=use_short_conv,
            conv_size=conv_size,
            use_output_gate=use_output_gate,
            norm_eps=norm_eps,
            chunk_size=chunk_size,
            impl=impl,
        )
        if self._init_directions((lambda: GLA(d_model, **kwargs)) if self.bidirectional else None):
            return
        self.q_proj = nn.Linear(d_model, key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, value_dim, bias=False)
        self.conv = ShortConv(2 * key_dim + value_dim, conv_size) if use_short_conv else None
        self.gk_proj = nn.Sequential(
            nn.Linear(d_model, gate_low_rank_dim, bias=False), nn.Linear(gate_low_rank_dim, key_dim, bias=True)
        )
        self.g_proj = nn.Linear(d_model, value_dim, bias=False) if use_output_gate else None
        self.norm = HeadNorm(self.dv, eps=norm_eps)
        self.o_proj = nn.Linear(value_dim, d_model, bias=False)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, heads={self.n_heads}, d_k={self.dk}, d_v={self.dv}, "
            f"short_conv={self.conv is not None}, bidirectional={self.bidirectional}"
        )

    def _heads(self, qkv: Tensor, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        q, k, v = qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        g = F.logsigmoid(self.gk_proj(x)) / self.gate_logit_normalizer
        if self.clamp_min is not None:
            g = g.clamp_min(self.clamp_min)
        h = self.n_heads
        return split_heads(q, h), split_heads(k, h), split_heads(v, h), split_heads(g, h)

    def _recur(self, heads: tuple[Tensor, ...], mask: Tensor | None) -> Tensor:
        return matrix_state.gla(*heads, mask=mask, chunk_size=self.chunk_size, impl=self.impl)

    def _recur_step(self, heads: tuple[Tensor, ...], S: Tensor) -> tuple[Tensor, Tensor]:
        return matrix_state.gla_step(*heads, S)
