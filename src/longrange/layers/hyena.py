"""Hyena (Poli et al. 2023, "Hyena Hierarchy: Towards Larger Convolutional Language Models",
arXiv 2302.10866) as a sequence primitive: a data-controlled recurrence of elementwise gates and
long convolutions whose filters are produced implicitly, by a small network over positions.

The operator of order N >= 2 on x of shape (batch, L, d), L <= l_max, as in the authors' code
(HazyResearch/safari, ``src/models/sequence/hyena.py``)::

    (x_0, ..., x_{N-1}, v) = split(short_conv(in_proj(x)))   # in_proj: Linear(d, (N+1)·d) with bias
    for o = 0, ..., N-2:                                      # gates x_{N-1}, x_{N-2}, ..., x_1 in turn
        u = dropout(x_{N-1-o} · v)
        v = h_o * u + b_o · u                                 # causal long convolution + per-channel bias (skip)
    y = out_proj(x_0 · v)                                     # out_proj: Linear(d, d) with bias

``short_conv`` is a depthwise causal convolution of width ``short_filter_order`` (with bias, no
activation) over all (N+1)·d channels, ``(h * u)[t] = sum_{s <= t} h[t - s] u[s]`` is computed by
FFT (:func:`longrange.ops.fftconv.fft_conv`), and ``·`` is the elementwise product. The code
gates *before* each convolution and keeps x_0 for a last gate, so an operator of order N has N
gates and N - 1 long convolutions (the paper's equations write z^{n+1} = x^n · (h^n * z^n) with
N filters; the released code, followed here, has N - 1).

Implicit filter (safari's ``HyenaFilter``), one filter per channel and long convolution,
C = d·(N-1) channels laid out as (channel of v, convolution o) -> index c·(N-1) + o::

    t_j = j / (l_max - 1),   ω_j = 2π j / l_max,                     j = 0, ..., l_max - 1
    z_j = [t_j, cos(f_1 ω_j), ..., cos(f_B ω_j), -sin(f_1 ω_j), ..., -sin(f_B ω_j)]
          B = (emb_dim - 1) / 2 bands, f = linspace(1e-4, B - 1, B)   (emb_dim odd, >= 3)
    ĥ_j = W_out σ(W_k ... σ(W_1 z_j + c_1) ... + c_k),  σ(a) = sin(w ⊙ a)
          width ``filter_order``, k = 1 + num_inner_mlps layers with bias, W_out without bias;
          one learnable frequency vector w (init ``w``) shared by all the sine activations
    h_j[c] = ĥ_j[c] · (exp(-t_j |δ_c|) + shift)          (with ``modulate``; otherwise h = ĥ)
          δ = linspace(ln(target) / slow_decay_pct, ln(target) / fast_decay_pct, C)  (fixed)

so the fastest channel's window falls to ``target`` at t = fast_decay_pct (30 % of l_max) and
the slowest at t = slow_decay_pct. Positions are normalised by ``l_max``: the filter is defined
over l_max positions, an input is convolved with its first L taps (so the output at t does not
depend on the input length) and an input longer than l_max is a ValueError. b_o is a learned
per-channel bias of each long convolution (standard normal init, as published).

Options and their published defaults (safari's ``configs/model/layer/hyena.yaml`` and
``hyena-filter.yaml``): ``order`` 2, ``filter_order`` 64 (the filter MLP's width), ``emb_dim``
3, ``short_filter_order`` 3, ``num_inner_mlps`` 2, ``w`` 1, ``fast_decay_pct`` 0.3,
``slow_decay_pct`` 1.5, ``target`` 1e-2, ``shift`` 0.0, ``modulate`` True, ``dropout`` 0 (on
each gated convolution input) and ``filter_dropout`` 0 (here: dropout on the filter taps while
training; safari accepts the option but does not apply it). ``l_max`` has no default.
Not implemented: safari's ``num_blocks``, ``outer_mixing``, ``post_order_ffn`` and output
``activation`` (defaults 1, off, off, identity: the layer here is those defaults) and its
``normalized`` filter.

Inner width and tied projections (MAD's ``inner_factor`` and ``proj_groups``; athms/mad-lab
``mad/model/layers/hyena.py``, ``HyenaOperator``). With ``inner_factor`` F the gates, v and the long
convolutions are D = F·d channels wide and ``out_proj`` maps D back to d; with ``proj_groups`` G the
input projection makes (N+1)·D / G channels, tiled G times (``[a, a, ..., a]``) before the short
convolution, which gives each copy its own taps. MAD's ``hyena`` is F = 4, G = 4 (in_proj 128 -> 384,
tiled to 1536; out_proj 512 -> 128).

Multi-head form (``head_dim`` P > 1, order 2 only; mad-lab's ``MultiHeadHyenaOperator`` and
``fftconv_heads``). The D channels of q = x_0, v = x_1 and k = the last projection form H = D / P
heads of P features each (channel h·P + i); the long convolution acts, per head, on the outer
product of key and value with one filter (and one bias b_h) per head, and the query reads it::

    y_t[h, j] = sum_i q_t[h, i] · ( sum_{s <= t} g_h[t - s] k_s[h, i] v_s[h, j] + b_h k_t[h, i] v_t[h, j] )

a linear attention whose cumulative sum is a learned long filter. P = 1 is the order-2 operator above
(x_0 · (h * (v · x_1))). mad-lab's configuration names P ``num_heads`` (its ``fftconv_heads`` reads
the value as each head's width: ``configs/layers/mh-hyena.yml`` with ``num_heads: 16`` at width 128
makes 8 heads of 16 features and 8 filters); MAD's ``mh-hyena`` is P = 16, F = 1, G = 4 (mad-lab's
default, which its multi-head layer does not override) and a filter network of width 2.

Optimiser hints. safari trains the filter network (its linear layers and the sine frequencies)
with its own ``lr`` (default 1e-3) and ``wd`` (default 0), the positional features ``z`` with
``lr_pos_emb`` (default 1e-5) and no weight decay, and keeps the decay rates δ fixed
(``modulation_lr`` 0). Learning rates here are relative to the trainer's, so the filter network
is hinted as group ``"hyena_filter"`` with ``lr_scale=filter_lr_scale`` (default 1: the
published 1e-3 is the filter default and its experiments set the filter lr to the optimiser's)
and ``weight_decay=filter_weight_decay`` (default 0), and z with ``lr_scale=pos_emb_lr_scale``
(default 0.01 = 1e-5 / 1e-3) and no weight decay; ``pos_emb_lr_scale=0`` makes z a fixed
buffer (as in safari's associative-recall experiments). The biases b_o are skip terms, trained
without weight decay (group ``"no_decay"``). An absolute learning rate can be pinned with the
trainer's ``param_groups`` rules (e.g. ``match: "*.filter.*"``).

Bidirectional mode (``bidirectional=True``). Causal Hyena cannot see the future; here the filter
network emits two kernels per channel and convolution, a forward one (lags 0, 1, ...) and a
backward one (the inputs 1, 2, ... steps ahead), used as :func:`fft_conv`'s two-sided kernel, and
the short convolution is centred (output t sees inputs t - ⌊K/2⌋ ... t + ⌊(K-1)/2⌋ for width K)
instead of causal. Why this and not two flipped causal layers summed (as S6 and Mamba-2 do): the
gates multiply the convolutions' outputs, so a sum of two causal operators would not be one
data-controlled recurrence over the whole sequence; with a two-sided kernel every long
convolution of the same recurrence sees both directions, at the cost of a second output block of
the filter network only (safari's reference ``fftconv_ref`` takes such a reversed kernel,
``k_rev``, for the same purpose). The decay window is shared by the two kernels of a channel.
A bidirectional layer has no step mode.

Padding: the input is zeroed at padded positions, and so are the projected and short-convolved
channels, so that no padded position feeds a convolution (the centred short convolution and the
backward kernel would otherwise read in_proj's bias there): outputs at real positions do not
depend on what or how much padding follows.

Generation (causal): ``default_state`` is an empty :class:`HyenaCache` holding the short
convolution's last K - 1 inputs and, for each long convolution, the history of its inputs u
(which grows with the position, like attention's KV cache, up to l_max); ``step`` appends this
position's u and sums the filter against the history. The multi-head form keeps the histories of k
and v (2·D per position, not the P·D of their outer products) and forms the filtered outer products
at each step. The filter itself is computed once, at
the first step, from the parameters and carried along (not counted as state).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longrange.errors import ConfigError
from longrange.layers.base import NO_DECAY_GROUP, SequencePrimitive, apply_mask, set_optim_hint
from longrange.layers.mixer_parts import ShortConv
from longrange.layers.registry import register_primitive
from longrange.layers.ssm import check_choice, check_positive_int
from longrange.ops.fftconv import fft_conv

#: The optimiser group of the implicit filter's network and positional features (see the module doc).
FILTER_GROUP = "hyena_filter"

#: Long-convolution implementations, those of :func:`fft_conv`: ``auto`` (by the length and device),
#: ``fft``, ``direct`` (one product with the Toeplitz matrix: O(L²), faster at short lengths on a
#: CPU) or ``ref`` (the explicit matrix by autograd, for checking).
CONV_IMPLS = ("auto", "fft", "direct", "ref")

_WHERE = "Hyena"


def positional_features(l_max: int, emb_dim: int) -> tuple[Tensor, Tensor]:
    """(z (l_max, emb_dim), t (l_max, 1)), float64: the normalised time t_j = j / (l_max - 1) and
    the complex-exponential features of the module docstring."""
    # linspace with its device named: torch.device(...) contexts can miss linspace once another
    # library has patched it while PyTorch first listed the functions they redirect (seen after
    # transformers' from_pretrained: a Hyena built on meta then got CPU tensors here).
    device = torch.get_default_device()
    t = torch.linspace(0.0, 1.0, l_max, dtype=torch.float64, device=device)[:, None]
    bands = (emb_dim - 1) // 2
    omega = 2 * math.pi * torch.arange(l_max, dtype=torch.float64) / l_max
    f = torch.linspace(1e-4, bands - 1, bands, dtype=torch.float64, device=device)
    phase = omega[:, None] * f[None, :]
    return torch.cat([t, torch.cos(phase), -torch.sin(phase)], dim=-1), t


class ImplicitFilter(nn.Module):
    """Hyena's implicit long filter (see the module docstring): ``forward(L)`` gives the filters
    of ``channels`` channels at lags 0 .. L - 1, as (kernels, channels, L); ``kernels`` is 1
    (causal) or 2 (a forward and a backward kernel)."""

    def __init__(
        self,
        channels: int,
        l_max: int,
        *,
        emb_dim: int = 3,
        width: int = 64,
        num_inner_mlps: int = 2,
        w: float = 1.0,
        fast_decay_pct: float = 0.3,
        slow_decay_pct: float = 1.5,
        target: float = 1e-2,
        shift: float = 0.0,
        modulate: bool = True,
        kernels: int = 1,
        lr_scale: float = 1.0,
        weight_decay: float = 0.0,
        pos_emb_lr_scale: float = 0.01,
    ):
        super().__init__()
        self.channels, self.l_max, self.kernels, self.modulate = channels, l_max, kernels, bool(modulate)
        self.shift = float(shift)
        dtype = torch.get_default_dtype()
        z, t = positional_features(l_max, emb_dim)
        if pos_emb_lr_scale > 0:
            self.z = set_optim_hint(
                nn.Parameter(z.to(dtype)), FILTER_GROUP, lr_scale=float(pos_emb_lr_scale), weight_decay=0.0
            )
        else:
            self.register_buffer("z", z.to(dtype))
        self.register_buffer("t", t.to(dtype))
        max_decay = math.log(target) / fast_decay_pct
        min_decay = math.log(target) / slow_decay_pct
        self.register_buffer(
            "deltas",
            torch.linspace(min_decay, max_decay, channels, dtype=torch.float64, device=torch.get_default_device()).to(
                dtype
            ),
        )
        self.first = nn.Linear(emb_dim, width)
        self.inner = nn.ModuleList(nn.Linear(width, width) for _ in range(num_inner_mlps))
        self.last = nn.Linear(width, kernels * channels, bias=False)
        self.freq = nn.Parameter(torch.full((width,), float(w)))
        for p in [self.freq, *self.first.parameters(), *self.inner.parameters(), *self.last.parameters()]:
            set_optim_hint(p, FILTER_GROUP, lr_scale=float(lr_scale), weight_decay=float(weight_decay))

    def extra_repr(self) -> str:
        return f"channels={self.channels}, l_max={self.l_max}, kernels={self.kernels}, modulate={self.modulate}"

    def window(self, L: int) -> Tensor:
        """(L, channels): the decay window exp(-t |δ|) + shift at the first L positions."""
        return torch.exp(-self.t[:L] * self.deltas.abs()) + self.shift

    def unmodulated(self, L: int) -> Tensor:
        """(L, kernels · channels): the network's output ĥ at the first L positions."""
        h = torch.sin(self.freq * self.first(self.z[:L]))
        for layer in self.inner:
            h = torch.sin(self.freq * layer(h))
        return self.last(h)

    def forward(self, L: int) -> Tensor:
        if not 1 <= L <= self.l_max:
            raise ValueError(
                f"{_WHERE}: the implicit filter is defined over l_max={self.l_max} positions, asked for {L}"
            )
        h = self.unmodulated(L).view(L, self.kernels, self.channels)
        if self.modulate:
            h = h * self.window(L).unsqueeze(1)
        return h.permute(1, 2, 0)


@dataclass(frozen=True)
class HyenaCache:
    """The state of a causal Hyena layer's step mode.

    ``conv``: (batch, (N+1)·D, K-1), the short convolution's last inputs; ``history``: N - 1
    tensors (batch, D, n), the inputs of each long convolution at the n positions seen (the
    multi-head form: k and v, two tensors (batch, D, n));
    ``position``: n; ``limit``: l_max, the most positions the history can hold; ``kernel``: the
    causal filters (channels, N-1, l_max), computed at the first step (a function of the parameters, not
    of the sequence: not counted as state).
    """

    conv: Tensor
    history: tuple[Tensor, ...]
    position: int = 0
    limit: int | None = None
    kernel: Tensor | None = None

    def elements(self, seq_len: int) -> int:
        """Elements per sequence after ``seq_len`` steps (for :func:`~longrange.layers.base.state_elements`)."""
        held = seq_len if self.limit is None else min(seq_len, self.limit)
        conv = self.conv.shape[1] * self.conv.shape[2]
        return conv + sum(h.shape[1] for h in self.history) * held


@register_primitive("hyena")
class Hyena(SequencePrimitive):
    """The Hyena operator (see the module docstring).

    Args:
        d_model: width d.
        l_max: the number of positions the implicit filter is defined over (the longest input).
        order: N >= 2: N + 1 projections, N - 1 long convolutions.
        filter_order: width of the filter network.
        emb_dim: size of the positional features (odd, >= 3): time and (emb_dim - 1) / 2 bands.
        short_filter_order: width K of the short depthwise convolution.
        num_inner_mlps: hidden (width x width) layers of the filter network.
        w: initial frequency of the filter network's sine activations.
        fast_decay_pct, slow_decay_pct, target, shift, modulate: the filter's decay window.
        dropout: dropout on each long convolution's input.
        filter_dropout: dropout on the filter taps (training only).
        filter_lr_scale, filter_weight_decay: the filter network's optimiser hint.
        pos_emb_lr_scale: the positional features' learning-rate scale (0: fixed).
        inner_factor: F, the inner width D = F·d of the gates and long convolutions.
        proj_groups: G, the input projection's (N+1)·D / G channels tiled G times.
        head_dim: P, the features per head of the multi-head form (1: the single-channel operator).
        bidirectional: two-sided long convolutions and a centred short convolution.
        conv_impl: ``auto``, ``fft``, ``direct`` or ``ref`` (:data:`CONV_IMPLS`).
    """

    def __init__(
        self,
        d_model: int,
        l_max: int,
        order: int = 2,
        filter_order: int = 64,
        emb_dim: int = 3,
        short_filter_order: int = 3,
        num_inner_mlps: int = 2,
        w: float = 1.0,
        fast_decay_pct: float = 0.3,
        slow_decay_pct: float = 1.5,
        target: float = 1e-2,
        shift: float = 0.0,
        modulate: bool = True,
        dropout: float = 0.0,
        filter_dropout: float = 0.0,
        filter_lr_scale: float = 1.0,
        filter_weight_decay: float = 0.0,
        pos_emb_lr_scale: float = 0.01,
        inner_factor: int = 1,
        proj_groups: int = 1,
        head_dim: int = 1,
        bidirectional: bool = False,
        conv_impl: str = "auto",
    ):
        super().__init__()
        for name, value in (
            ("d_model", d_model),
            ("l_max", l_max),
            ("order", order),
            ("filter_order", filter_order),
            ("emb_dim", emb_dim),
            ("short_filter_order", short_filter_order),
            ("inner_factor", inner_factor),
            ("proj_groups", proj_groups),
            ("head_dim", head_dim),
        ):
            check_positive_int(name, value, where=_WHERE)
        if order < 2:
            raise ConfigError(
                f"{_WHERE}: order must be at least 2 (N + 1 projections, N - 1 long convolutions), got {order}"
            )
        if emb_dim < 3 or emb_dim % 2 == 0:
            raise ConfigError(
                f"{_WHERE}: emb_dim must be odd and >= 3 (time, then cosine and sine of each band), got {emb_dim}"
            )
        if not isinstance(num_inner_mlps, int) or isinstance(num_inner_mlps, bool) or num_inner_mlps < 0:
            raise ConfigError(f"{_WHERE}: num_inner_mlps must be a non-negative integer, got {num_inner_mlps!r}")
        if not (0 < fast_decay_pct and 0 < slow_decay_pct):
            raise ConfigError(
                f"{_WHERE}: fast_decay_pct and slow_decay_pct must be positive, got "
                f"{fast_decay_pct!r} and {slow_decay_pct!r}"
            )
        if not 0 < target < 1:
            raise ConfigError(
                f"{_WHERE}: target (the window's value at the decay point) must be in (0, 1), got {target!r}"
            )
        for name, p in (("dropout", dropout), ("filter_dropout", filter_dropout)):
            if not 0 <= p < 1:
                raise ConfigError(f"{_WHERE}: {name} must be in [0, 1), got {p!r}")
        for name, value in (
            ("filter_lr_scale", filter_lr_scale),
            ("filter_weight_decay", filter_weight_decay),
            ("pos_emb_lr_scale", pos_emb_lr_scale),
        ):
            if not value >= 0:
                raise ConfigError(f"{_WHERE}: {name} must be >= 0, got {value!r}")
        check_choice("conv_impl", conv_impl, CONV_IMPLS, where=_WHERE)
        inner = inner_factor * d_model
        width = (order + 1) * inner
        if width % proj_groups:
            raise ConfigError(
                f"{_WHERE}: proj_groups={proj_groups} must divide the (order + 1) x inner width = {width} channels "
                "that the tiled input projection makes"
            )
        if head_dim > 1 and order != 2:
            raise ConfigError(
                f"{_WHERE}: the multi-head form (head_dim={head_dim} > 1) is of order 2, got order {order}"
            )
        if inner % head_dim:
            raise ConfigError(
                f"{_WHERE}: head_dim={head_dim} must divide the inner width {inner} (inner_factor x d_model)"
            )
        self.d_model, self.l_max, self.order = d_model, l_max, order
        self.inner, self.proj_groups, self.head_dim = inner, proj_groups, head_dim
        self.short_filter_order, self.conv_impl = short_filter_order, conv_impl
        self.bidirectional = bool(bidirectional)
        self.channels = inner // head_dim  # one filter per channel (per head in the multi-head form)
        self.in_proj = nn.Linear(d_model, width // proj_groups)
        self.short_conv = ShortConv(width, short_filter_order, bias=True, activation=None)
        self.filter = ImplicitFilter(
            self.channels * (order - 1),
            l_max,
            emb_dim=emb_dim,
            width=filter_order,
            num_inner_mlps=num_inner_mlps,
            w=w,
            fast_decay_pct=fast_decay_pct,
            slow_decay_pct=slow_decay_pct,
            target=target,
            shift=shift,
            modulate=modulate,
            kernels=2 if self.bidirectional else 1,
            lr_scale=filter_lr_scale,
            weight_decay=filter_weight_decay,
            pos_emb_lr_scale=pos_emb_lr_scale,
        )
        self.bias = set_optim_hint(nn.Parameter(torch.randn(self.channels * (order - 1))), NO_DECAY_GROUP)
        self.out_proj = nn.Linear(inner, d_model)
        self.dropout = nn.Dropout(dropout)
        self.filter_dropout = nn.Dropout(filter_dropout)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, l_max={self.l_max}, order={self.order}, "
            f"short_filter_order={self.short_filter_order}, bidirectional={self.bidirectional}"
            + (f", inner={self.inner}" if self.inner != self.d_model else "")
            + (f", proj_groups={self.proj_groups}" if self.proj_groups > 1 else "")
            + (f", head_dim={self.head_dim}" if self.head_dim > 1 else "")
        )

    def kernels(self, L: int) -> Tensor:
        """(kernels, channels, N - 1, L): the filters h_o at lags 0 .. L - 1 (kernel 1: the backward
        ones); channels: D, or the H heads of the multi-head form."""
        k = self.filter_dropout(self.filter(L))
        return k.reshape(k.shape[0], self.channels, self.order - 1, L)

    def _project(self, x: Tensor) -> Tensor:
        """in_proj, tiled ``proj_groups`` times along the last dimension."""
        u = self.in_proj(x)
        return u.repeat(*([1] * (u.dim() - 1)), self.proj_groups) if self.proj_groups > 1 else u

    def _check_length(self, L: int) -> None:
        if L > self.l_max:
            raise ValueError(
                f"{_WHERE}: input length {L} exceeds l_max={self.l_max}, the number of positions its implicit "
                "filter is defined over; build the layer with l_max >= the longest input"
            )

    def _short(self, u: Tensor) -> Tensor:
        """The short convolution over (batch, L, channels): causal, or centred when bidirectional."""
        if not self.bidirectional:
            return self.short_conv(u)
        ahead = (self.short_filter_order - 1) // 2  # a causal convolution read `ahead` steps later
        return self.short_conv(F.pad(u, (0, 0, 0, ahead)))[:, ahead:]

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x: (batch, L, d_model), L <= l_max; mask: (batch, L), True at real positions."""
        self._check_input(x)
        L = x.shape[1]
        self._check_length(L)
        u = apply_mask(self._project(apply_mask(x, mask)), mask)
        # channels last throughout, (batch, L, (N+1)·d): the convolutions take and give that layout
        # (their transposes folded into the FFTs' padding), so the gates meet their outputs in one
        # layout, forward and backward
        u = apply_mask(self._short(u), mask)
        *gates, v = u.split(self.inner, dim=2)
        k = self.kernels(L)
        if self.head_dim > 1:
            return self.out_proj(self._heads(gates[0], gates[1], v, k))
        bias = self.bias.view(self.inner, self.order - 1)
        for o, gate in enumerate(reversed(gates[1:])):
            v = self.dropout(v * gate)
            kernel = (k[0, :, o], k[1, :, o]) if self.bidirectional else k[0, :, o]
            v = fft_conv(v, kernel, bias[:, o], impl=self.conv_impl, channels_last=True)
        return self.out_proj(gates[0] * v)

    def _heads(self, q: Tensor, v: Tensor, k: Tensor, filters: Tensor) -> Tensor:
        """The multi-head form over (batch, L, D) inputs: (batch, L, D)."""
        B, L, _ = q.shape
        H, P = self.channels, self.head_dim
        # outer products laid out (batch, i, j, head, L): a batch of B·P·P channels-first
        # sequences of H channels, one filter each
        k_, v_ = (t.view(B, L, H, P).permute(0, 3, 2, 1) for t in (k, v))  # (B, P, H, L)
        kv = self.dropout(k_.unsqueeze(2) * v_.unsqueeze(1))
        kernel = (filters[0, :, 0], filters[1, :, 0]) if self.bidirectional else filters[0, :, 0]
        conv = fft_conv(kv.reshape(B * P * P, H, L), kernel, self.bias, impl=self.conv_impl)
        y = torch.einsum("blhi,bijhl->blhj", q.view(B, L, H, P), conv.view(B, P, P, H, L))
        return y.reshape(B, L, self.inner)

    def default_state(
        self, batch_size: int, device: torch.device | None = None, dtype: torch.dtype | None = None
    ) -> HyenaCache:
        """An empty cache: the short convolution's zero inputs and N - 1 empty histories."""
        self._check_step()
        p = self.in_proj.weight
        device, dtype = device or p.device, dtype or p.dtype
        histories = 2 if self.head_dim > 1 else self.order - 1  # k and v, or each convolution's input
        empty = tuple(torch.zeros(batch_size, self.inner, 0, device=device, dtype=dtype) for _ in range(histories))
        return HyenaCache(
            conv=self.short_conv.zero_state(batch_size, device, dtype), history=empty, position=0, limit=self.l_max
        )

    def step(self, x: Tensor, state: HyenaCache) -> tuple[Tensor, HyenaCache]:
        """One position: x (batch, d_model) -> (y (batch, d_model), the updated cache)."""
        self._check_step()
        if x.dim() != 2 or x.shape[-1] != self.d_model:
            raise ValueError(f"Hyena.step expects input of shape (batch, {self.d_model}), got {tuple(x.shape)}")
        if not isinstance(state, HyenaCache):
            raise TypeError(f"Hyena.step expects a HyenaCache state (from default_state), got {type(state).__name__}")
        if state.position >= self.l_max:
            raise ValueError(
                f"{_WHERE}: step at position {state.position} is beyond l_max={self.l_max}, the number of "
                "positions its implicit filter is defined over"
            )
        kernel = state.kernel if state.kernel is not None else self.kernels(self.l_max)[0]
        u, conv = self.short_conv.step(self._project(x), state.conv)
        *gates, v = u.split(self.inner, dim=-1)
        n = state.position + 1
        taps = kernel[..., :n].flip(-1).to(x.dtype)  # taps[..., s] = h[n - 1 - s]: weighs the input at s
        if self.head_dim > 1:
            y, history = self._heads_step(gates[0], gates[1], v, taps[:, 0], state.history)
            return self.out_proj(y), HyenaCache(
                conv=conv, history=history, position=n, limit=state.limit, kernel=kernel
            )
        bias = self.bias.view(self.inner, self.order - 1)
        history = []
        for o, gate in enumerate(reversed(gates[1:])):
            u_o = self.dropout(v * gate)
            held = torch.cat([state.history[o], u_o.unsqueeze(-1)], dim=-1)  # (batch, d, n)
            v = (held * taps[:, o]).sum(-1) + bias[:, o] * u_o
            history.append(held)
        y = self.out_proj(gates[0] * v)
        return y, HyenaCache(conv=conv, history=tuple(history), position=n, limit=state.limit, kernel=kernel)

    def _heads_step(
        self, q: Tensor, v: Tensor, k: Tensor, taps: Tensor, held: tuple[Tensor, ...]
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """One position of the multi-head form: q, v, k (batch, D), taps (H, n) over the n positions
        seen; the output (batch, D) and the histories of k and v with this position's appended."""
        B, (H, P) = q.shape[0], (self.channels, self.head_dim)
        ks, vs = (torch.cat([h, t.unsqueeze(-1)], dim=-1) for h, t in zip(held, (k, v)))  # (batch, D, n)
        n = ks.shape[-1]
        weighted = ks.view(B, H, P, n) * taps.unsqueeze(1)
        state = torch.einsum("bhin,bhjn->bhij", weighted, vs.view(B, H, P, n))
        k_, v_ = k.view(B, H, P), v.view(B, H, P)
        state = state + self.bias.view(H, 1, 1) * k_.unsqueeze(-1) * v_.unsqueeze(-2)
        y = torch.einsum("bhi,bhij->bhj", q.view(B, H, P), state)
        return y.reshape(B, self.inner), (ks, vs)
