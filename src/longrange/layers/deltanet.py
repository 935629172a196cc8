"""DeltaNet and Gated DeltaNet as sequence primitives.

DeltaNet (Yang et al. 2024, arXiv 2406.06484), as flash-linear-attention's
``fla/layers/delta_net.py`` builds it (H heads; key width ``expand_k · d_model``, value width
``expand_v · d_model``)::

    q, k, v = SiLU(conv(q_proj(x))), SiLU(conv(k_proj(x))), SiLU(conv(v_proj(x)))   # short convolutions
    q, k = q / ||q||, k / ||k||                       # per head (the L2 norm that keeps the recurrence stable)
    beta = sigmoid(b_proj(x))                         # (H,) per position; x2 with allow_neg_eigval
    S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T;  o_t = q_t S_t / sqrt(d_k)
    out = o_proj(RMSNorm(o))                          # head-wise; gated by SiLU(g_proj(x)) with use_gate

Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024, arXiv 2412.06464), as ``fla/layers/gated_deltanet.py``
builds it (H heads of key width ``head_dim`` and value width ``expand_v · head_dim``)::

    alpha_t = exp(g_t),  g_t = -exp(A_log) · softplus(a_proj(x) + dt_bias)     # (H,), Mamba-2's decay
    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
    out = o_proj(RMSNorm(o) · SiLU(g_proj(x)))        # the output gate is on by default

with A uniform in (0, 16] and dt_bias Mamba's inverse-softplus initialisation (A_log and dt_bias
trained without weight decay). Computed by :func:`longrange.ops.matrix_state.delta_rule` and
:func:`~longrange.ops.matrix_state.gated_delta_rule`, which normalise q and k themselves
(``normalize_qk``: inside the numba kernels that run the small heads on CPUs). Both are whole attention-like layers: use
them in ``block: residual`` with an MLP (``model.mlp: swiglu``), as FLA's models stack them.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longrange.errors import ConfigError
from longrange.layers.mixer_parts import (
    HeadNorm,
    QKVMixer,
    ShortConv,
    check_heads,
    inverse_softplus_dt,
    no_decay,
    split_heads,
)
from longrange.layers.registry import register_primitive
from longrange.layers.ssm import check_positive_int
from longrange.ops.matrix_state import dispatch as matrix_state
from longrange.ops.matrix_state.common import normalize_qk


class _DeltaLayer(QKVMixer):
    """What DeltaNet and Gated DeltaNet share: projections, short convolutions, normalised keys,
    beta, the (gated) output norm; ``gated`` adds Mamba-2's per-head decay."""

    OPTION_NOTES: ClassVar[dict[str, str]] = {
        "chunk_size": "chunked form: on a CPU 16 for key widths up to 32, else 32; other devices 64 "
        "(numba: positions between its backward's checkpoints, as many states as its buffer holds)",
        "impl": 'the op\'s default for the process: "auto" unless changed by its set_default_impl',
    }

    gated: bool = False
    where: str = ""

    def _build(
        self,
        d_model: int,
        n_heads: int,
        dk: int,
        dv: int,
        use_short_conv: bool,
        conv_size: int,
        use_gate: bool,
        allow_neg_eigval: bool,
        norm_eps: float,
        chunk_size: int | None,
        impl: str | None,
    ) -> None:
        if chunk_size is not None:
            check_positive_int("chunk_size", chunk_size, where=self.where)
        check_positive_int("conv_size", conv_size, where=self.where)
        matrix_state.check_impl("gated_delta_rule" if self.gated else "delta_rule", impl, self.where)
        self.d_model, self.n_heads, self.dk, self.dv = d_model, n_heads, dk, dv
        self.key_dim, self.value_dim = n_heads * dk, n_heads * dv
        self.allow_neg_eigval, self.chunk_size, self.impl = bool(allow_neg_eigval), chunk_size, impl
        self.q_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, self.key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, self.value_dim, bias=False)
        self.b_proj = nn.Linear(d_model, n_heads, bias=False)
        self.conv = ShortConv(2 * self.key_dim + self.value_dim, conv_size) if use_short_conv else None
        self.g_proj = nn.Linear(d_model, self.value_dim, bias=False) if use_gate else None
        self.norm = HeadNorm(dv, eps=norm_eps)
        self.o_proj = nn.Linear(self.value_dim, d_model, bias=False)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, heads={self.n_heads}, d_k={self.dk}, d_v={self.dv}, "
            f"short_conv={self.conv is not None}, bidirectional={self.bidirectional}"
        )

    def _heads(self, qkv: Tensor, x: Tensor) -> tuple[Tensor, ...]:
        """(q, k, v, beta, g or None) per head, from the (convolved) projections and the input x."""
        if self.conv is None:
            qkv = F.silu(qkv)
        q, k, v = (
            split_heads(t, self.n_heads) for t in qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        )
        beta = torch.sigmoid(self.b_proj(x)) * (2.0 if self.allow_neg_eigval else 1.0)
        return q, k, v, beta, self._log_decay(x)

    def _log_decay(self, x: Tensor) -> Tensor | None:
        return None

    def _recur(self, heads: tuple[Tensor, ...], mask: Tensor | None) -> Tensor:
        q, k, v, beta, g = heads
        if self.gated:
            return matrix_state.gated_delta_rule(
                q, k, v, g, beta, mask=mask, chunk_size=self.chunk_size, impl=self.impl, normalize_qk=True
            )
        return matrix_state.delta_rule(
            q, k, v, beta, mask=mask, chunk_size=self.chunk_size, impl=self.impl, normalize_qk=True
        )

    def _recur_step(self, heads: tuple[Tensor, ...], S: Tensor) -> tuple[Tensor, Tensor]:
        q, k, v, beta, g = heads
        q, k = normalize_qk(q), normalize_qk(k)
        if self.gated:
            return matrix_state.gated_delta_rule_step(q, k, v, g, beta, S)
        return matrix_state.delta_rule_step(q, k, v, beta, S)


@register_primitive("deltanet")
class DeltaNet(_DeltaLayer):
    """The DeltaNet layer (see the module docstring)."""

    where = "DeltaNet"

    def __init__(
        self,
        d_model: int,
        n_heads: int = 4,
        expand_k: float = 1.0,
        expand_v: float = 1.0,
        use_short_conv: bool = True,
        conv_size: int = 4,
        use_gate: bool = False,
        allow_neg_eigval: bool = False,
        norm_eps: float = 1e-5,
        chunk_size: int | None = None,
        bidirectional: bool = False,
        impl: str | None = None,
    ):
        super().__init__()
        check_positive_int("d_model", d_model, where=self.where)
        dk = check_heads(self.where, int(d_model * expand_k), n_heads, "the key width expand_k * d_model =")
        dv = check_heads(self.where, int(d_model * expand_v), n_heads, "the value width expand_v * d_model =")
        if dk < 1 or dv < 1:
            raise ConfigError(f"{self.where}: expand_k and expand_v must give positive head widths, got {dk} and {dv}")
        self.bidirectional = bool(bidirectional)
        kwargs = dict(
            n_heads=n_heads,
            expand_k=expand_k,
            expand_v=expand_v,
            use_short_conv=use_short_conv,
            conv_size=conv_size,
            use_gate=use_gate,
            allow_neg_eigval=allow_neg_eigval,
            norm_eps=norm_eps,
            chunk_size=chunk_size,
            impl=impl,
        )
        if self._init_directions((lambda: DeltaNet(d_model, **kwargs)) if self.bidirectional else None):
            self.d_model, self.n_heads, self.dk, self.dv = d_model, n_heads, dk, dv
            return
        self._build(
            d_model, n_heads, dk, dv, use_short_conv, conv_size, use_gate, allow_neg_eigval, norm_eps, chunk_size, impl
        )


@register_primitive("gated-deltanet")
class GatedDeltaNet(_DeltaLayer):
    """The Gated DeltaNet layer (see the module docstring)."""

    OPTION_NOTES: ClassVar[dict[str, str]] = {**_DeltaLayer.OPTION_NOTES, "head_dim": "d_model / n_heads"}

    gated = True
    where = "Gated DeltaNet"

    def __init__(
        self,
        d_model: int,
        n_heads: int = 4,
        head_dim: int | None = None,
        expand_v: float = 2.0,
        use_short_conv: bool = True,
        conv_size: int = 4,
        use_gate: bool = True,
        allow_neg_eigval: bool = False,
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        dt_init_floor: float = 1e-4,
        norm_eps: float = 1e-5,
        chunk_size: int | None = None,
        bidirectional: bool = False,
        impl: str | None = None,
    ):
        """``head_dim`` (None: ``d_model / n_heads``) is each head's key width; ``expand_v`` its value
        width's multiple (the published layer: head_dim 256, 6 heads, expand_v 2 at width 2048)."""
        super().__init__()
        check_positive_int("d_model", d_model, where=self.where)
        if head_dim is None:
            head_dim = check_heads(self.where, d_model, n_heads, "d_model")
        check_positive_int("head_dim", head_dim, where=self.where)
        check_positive_int("n_heads", n_heads, where=self.where)
        dv = head_dim * expand_v
        if dv != int(dv) or dv < 1:
            raise ConfigError(f"{self.where}: expand_v * head_dim must be a positive integer, got {dv}")
        self.bidirectional = bool(bidirectional)
        kwargs = dict(
            n_heads=n_heads,
            head_dim=head_dim,
            expand_v=expand_v,
            use_short_conv=use_short_conv,
            conv_size=conv_size,
            use_gate=use_gate,
            allow_neg_eigval=allow_neg_eigval,
            dt_min=dt_min,
            dt_max=dt_max,
            dt_init_floor=dt_init_floor,
            norm_eps=norm_eps,
            chunk_size=chunk_size,
            impl=impl,
        )
        if self._init_directions((lambda: GatedDeltaNet(d_model, **kwargs)) if self.bidirectional else None):
            self.d_model, self.n_heads, self.dk, self.dv = d_model, n_heads, head_dim, int(dv)
            return
        self._build(
            d_model,
            n_heads,
            head_dim,
            int(dv),
            use_short_conv,
            conv_size,
            use_gate,
            allow_neg_eigval,
            norm_eps,
            chunk_size,
            impl,
        )
        self.a_proj = nn.Linear(d_model, n_heads, bias=False)
        self.A_log = no_decay(torch.log(torch.empty(n_heads).uniform_(0, 16).clamp_min(1e-4)))
        self.dt_bias = no_decay(inverse_softplus_dt(n_heads, dt_min, dt_max, dt_init_floor))

    def _log_decay(self, x: Tensor) -> Tensor:
        return -torch.exp(self.A_log) * F.softplus(self.a_proj(x) + self.dt_bias)
