"""H3, the Hungry Hungry Hippos layer (Fu, Dao, Saab, Thomas, Rudra and Ré, "Hungry Hungry Hippos:
Towards Language Modeling with State Space Models", arXiv 2212.14052): a shift SSM on the keys, a
diagonal SSM on the key-value product, and a multiplicative gate with the queries.

Forward, for x (batch, length, d) with ``P = head_dim``, ``H = d / P`` heads, ``N = d_state``;
channel ``c = h·P + i`` is entry i of head h::

    q_t, k_t, v_t = W_q x_t + b_q,  W_k x_t + b_k,  W_v x_t + b_v          # Linear(d, d) each

    # shift SSM on each key channel c: A the N x N shift matrix, B = e_1, C_c learnt, skip D_c
    s_t = A s_{t-1} + e_1 k_t[c]                  # s_t = (k_t, k_{t-1}, ..., k_{t-N+1})[c]
    k̄_t[c] = C_c · s_t + D_c k_t[c] = Σ_{j<N} C_c[j] k_{t-j}[c] + D_c k_t[c]

    # per head h, the P x P outer product; each entry a sequence through the inner SSM's channel h
    kv_t[h, i, j] = k̄_t[h·P + i] · v_t[h·P + j]
    z[h, i, j] = SSM_h(kv[h, i, j])               # the same SSM (channel h) for all P² entries

    o_t[j·H + h] = Σ_i q_t[h·P + i] · z_t[h, i, j]            # the published output layout
    y_t = W_o o_t + b_o

With ``head_dim=1`` (the default) this is ``y = W_o (q ⊙ SSM(k̄ ⊙ v)) + b_o``. The shift SSM is a
learnt causal depthwise convolution of width N (kernel C, plus D), computed here by
:func:`longrange.ops.fftconv.fft_conv`. The inner SSM is a sequence primitive of width H that sees
the P² entries of each head as P² more sequences of the batch (batch order (b, i, j)).

Step mode: the state is ``{"keys": the last N - 1 keys (batch, d, N - 1), oldest first,
"inner": the inner primitive's state for batch · P² sequences}``; one step shifts the key buffer
and steps the inner primitive. The published recurrence keeps N entries in s, the oldest of which
is shifted out before it is read; the N - 1 kept here are all that the next output uses.

Options:

* ``d_state``: N, the shift convolution's width and the state size offered to the inner SSM (the
  model passes ``model.d_state``). Published default 64.
* ``head_dim``: P, must divide ``d_model``. Published default 1.
* ``inner``: the inner (diagonal) SSM, any registered primitive name built with width H:

  - ``"s4d"`` (default, as published): with ``init="lin"`` (S4D-Lin, A = -1/2 + iπn, B = 1; the
    published ``measure: diag-lin``), ``discretization="bilinear"`` (the published diagonal
    kernel's default) and ``d_init="randn"`` (the published D ~ N(0, 1)), unless
    ``inner_options`` sets them; Δ log-uniform in [0.001, 0.1] (S4D's default, as published);
  - ``"s6"``: "H3 with S6" of the Mamba paper's Table 1 (Gu and Dao, arXiv 2312.00752), the
    selective SSM over the kv channels with S6's own defaults (``dt_rank`` ceil(H/16)); note
    that it gets ``d_state`` of H3 (``inner_options={"d_state": 16}`` gives Mamba's N);
  - ``"s4"`` (H3 with S4; ``l_max`` goes to S4), ``"dlr"``, or any other registered causal
    primitive (its own step mode is used).

  ``"h3"`` itself is refused.
* ``inner_options``: a dict of options for the inner primitive (they override ``d_state``,
  ``l_max`` and the S4D defaults above; ``bidirectional`` is H3's own and cannot be set there).
* ``l_max``: passed to an inner primitive that takes ``l_max`` (S4's kernel length), None to
  leave its default. (The published layer truncates its diagonal kernel to ``l_max`` when given;
  here the inner kernel always spans the sequence, as published with its default ``l_max=None``.)
* ``bidirectional``: see below.

Published defaults and initialisation (HazyResearch/safari, ``src/models/sequence/h3.py``,
``configs/model/layer/h3.yaml``, ``src/models/sequence/ssm/ss_kernel.py``): d_state 64, head_dim 1,
inner S4D-Lin as above; the shift SSM's C as PyTorch's ``nn.Conv1d`` weight of width N (Kaiming
uniform with a = √5, i.e. uniform in ±N^(-1/2)); its D ~ N(0, 1); q, k, v and output projections
PyTorch's Linear default. The published code also trains the shift SSM's B (initialised e_1) at
the SSM learning rate; its kernel is the cross-correlation of B with C truncated to N taps, so with
B fixed at e_1 (here) the kernel is C itself and every width-N causal kernel is still reachable.
The published SSM learning rate min(0.001, lr) corresponds here to the trainer's ``ssm`` parameter
group (the inner SSM's parameters carry that hint). The shift SSM's C is an ordinary parameter (as
published, without an optimiser hint); its skip D carries ``group="no_decay"`` like the toolkit's
other skip terms.

Bidirectional (not in the paper): when the inner primitive has a bidirectional mode (S4D, S4,
DLR, S6, ...), one layer with both SSMs two-sided: the shift convolution gets a second, backward
kernel of width N over the keys strictly after t (the two-sided convention of
:mod:`longrange.ops.fftconv`; ``shift_C`` has shape (2, d, N)), the inner SSM is built
bidirectional, and the projections and the gate are shared. This keeps H3's form (one gate over
one two-sided state) at the parameter count of one layer. An inner primitive without a
bidirectional mode gives instead the flip-and-sum of two causal H3 layers
(:class:`~longrange.layers.bidirectional.FlipSum`, in ``directions``). A bidirectional layer has
no step mode.

Padding (``mask``, True at real positions): the input is zeroed at padded positions, and so are the
keys (whose bias would otherwise make them non-zero) and the kv sequences (the inner primitive
zeroes its input where the mask is False), so that outputs at real positions do not depend on what
follows in the padding, in either direction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from longrange.errors import ConfigError
from longrange.layers.base import SequencePrimitive, apply_mask
from longrange.layers.bidirectional import FlipSum
from longrange.layers.registry import PRIMITIVES, register_primitive
from longrange.layers.ssm import check_positive_int, skip_parameter
from longrange.ops.fftconv import fft_conv

#: The options that H3 gives its inner primitive unless ``inner_options`` sets them: the published
#: diagonal SSM (S4D-Lin, bilinear discretisation, D ~ N(0, 1)).
INNER_DEFAULTS: dict[str, dict[str, Any]] = {
    "s4d": {"init": "lin", "discretization": "bilinear", "d_init": "randn"},
}


#: Heads up to this size form their outer products and contractions as P² elementwise products of
#: whole (batch, length, heads) slices; larger ones as batched matrix products (einsum). With heads
#: of 2 (the recall study's H3) a training step took 82.8 ms against 102.2 ms with einsum, whose
#: backward ran products of 2 x 2 matrices and sums over strided memory (batch 32 x length 128,
#: width 64, one thread; docs/small-models.md, "Sixth round").
SMALL_HEAD = 4


@register_primitive("h3")
class H3(SequencePrimitive):
    """H3 (see the module docstring for the formulas, options and published defaults).

    Args:
        d_model: width d.
        d_state: N, the shift convolution's width and the inner SSM's state size (default 64).
        head_dim: P, the head size (default 1); must divide d_model.
        inner: the registered name of the inner SSM primitive (default ``"s4d"``).
        inner_options: options of the inner primitive.
        l_max: passed to an inner primitive that takes ``l_max`` (S4); None leaves its default.
        bidirectional: two-sided shift convolution and inner SSM, or the flip-and-sum of two
            causal H3 layers when the inner primitive has no bidirectional mode.
    """

    OPTION_NOTES: ClassVar[dict[str, str]] = {
        "inner_options": "H3's settings of the inner primitive only: its d_state, and for S4D the published "
        "S4D-Lin, bilinear, D ~ N(0, 1)",
        "l_max": "the inner primitive's own default (its kernel spans the sequence)",
    }

    def __init__(
        self,
        d_model: int,
        d_state: int = 64,
        head_dim: int = 1,
        inner: str = "s4d",
        inner_options: Mapping[str, Any] | None = None,
        l_max: int | None = None,
        bidirectional: bool = False,
    ):
        super().__init__()
        check_positive_int("d_model", d_model, where="H3")
        check_positive_int("d_state", d_state, where="H3")
        check_positive_int("head_dim", head_dim, where="H3")
        if d_model % head_dim:
            raise ConfigError(f"H3: d_model = {d_model} is not divisible by head_dim={head_dim}")
        if l_max is not None:
            check_positive_int("l_max", l_max, where="H3")
        if not isinstance(inner, str):
            raise ConfigError(f"H3: inner must be the name of a registered primitive, got {inner!r}")
        if inner_options is None:
            inner_options = {}
        if not isinstance(inner_options, Mapping):
            raise ConfigError(
                f"H3: inner_options must be a dict of the inner primitive's options, got {inner_options!r}"
            )
        inner_options = dict(inner_options)
        if "bidirectional" in inner_options:
            raise ConfigError(
                "H3: inner_options: 'bidirectional' is set by H3's own bidirectional option; set it there"
            )
        if inner == "h3":
            raise ConfigError(
                "H3: inner='h3': H3 cannot be its own inner SSM; choose an SSM primitive such as 's4d' or 's6'"
            )
        try:
            inner_cls = PRIMITIVES.get(inner)
        except ConfigError as err:
            raise ConfigError(f"H3: inner: {err}") from None

        self.d_model, self.d_state, self.head_dim = d_model, d_state, head_dim
        self.n_heads = d_model // head_dim
        self.inner_name, self.inner_options, self.l_max = inner, inner_options, l_max
        self.bidirectional = bool(bidirectional)
        takes_bidirectional = PRIMITIVES.accepts(inner, "bidirectional", 1)
        inner_bidirectional = takes_bidirectional or getattr(inner_cls, "bidirectional", False) is True
        self.directions: FlipSum | None = None
        if self.bidirectional and not inner_bidirectional:
            # No two-sided inner SSM: the flip-and-sum of two causal H3 layers.
            def make() -> H3:
                return H3(d_model, d_state, head_dim, inner, inner_options, l_max, bidirectional=False)

            self.directions = FlipSum(make(), make())
            return

        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        channels = 2 if self.bidirectional else 1
        bound = d_state**-0.5  # nn.Conv1d's init for a depthwise width-N kernel (Kaiming uniform, a=√5)
        self.shift_C = nn.Parameter(torch.empty(channels, d_model, d_state).uniform_(-bound, bound))
        self.shift_D = skip_parameter(torch.randn(d_model))

        offered: dict[str, Any] = {"d_state": d_state, **INNER_DEFAULTS.get(inner, {})}
        if l_max is not None:
            offered["l_max"] = l_max
        if takes_bidirectional:
            offered["bidirectional"] = self.bidirectional
        try:
            self.inner: SequencePrimitive = PRIMITIVES.build_from(
                inner, (self.n_heads,), inner_options, offered=offered
            )
        except ConfigError as err:
            raise ConfigError(f"H3: inner={inner!r}: {err}") from None
        if bool(self.inner.bidirectional) != self.bidirectional:
            kind = "bidirectional" if self.inner.bidirectional else "causal"
            raise ConfigError(
                f"H3: inner={inner!r} is {kind} only; a {'bidirectional' if self.bidirectional else 'causal'} H3 "
                f"needs a {'bidirectional' if self.bidirectional else 'causal'} inner SSM"
            )
        self.out_proj = nn.Linear(d_model, d_model)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, d_state={self.d_state}, head_dim={self.head_dim}, inner={self.inner_name!r}, "
            f"bidirectional={self.bidirectional}"
        )

    # ---- pieces -------------------------------------------------------------------------------

    def shift(self, k: Tensor) -> Tensor:
        """The shift SSM on keys k (batch, length, d): the causal (or, bidirectional, two-sided)
        convolution with ``shift_C`` plus the skip ``shift_D``."""
        C = self.shift_C if self.bidirectional else self.shift_C[0]
        # laid out as shaped, forward and backward: its product with the values reads one layout
        return fft_conv(k, C, self.shift_D, channels_last=True)

    def _kv(self, k: Tensor, v: Tensor) -> Tensor:
        """(batch, length, d) keys and values -> the per-head outer products as the inner SSM's
        input, (batch · P², length, H) in batch order (b, i, j)."""
        P = self.head_dim
        if P == 1:
            return k * v
        b, l, _ = k.shape
        kh, vh = k.reshape(b, l, self.n_heads, P), v.reshape(b, l, self.n_heads, P)
        if P <= SMALL_HEAD:  # P² products of (b, l, H) slices, stacked in (b, i, j) order: no transpose
            ks, vs = kh.unbind(-1), vh.unbind(-1)  # unbind: its backward is one stack, not P selects
            kv = torch.stack([ks[i] * vs[j] for i in range(P) for j in range(P)], dim=1)
            return kv.reshape(b * P * P, l, self.n_heads)
        kv = kh.unsqueeze(-1) * vh.unsqueeze(-2)  # (b, l, H, i, j)
        return kv.permute(0, 3, 4, 1, 2).reshape(b * P * P, l, self.n_heads)

    def _gate(self, q: Tensor, z: Tensor) -> Tensor:
        """Queries (batch, length, d) contracted with the inner SSM's output (batch · P², length, H):
        o[..., j·H + h] = Σ_i q[..., h·P + i] z[(b, i, j), ..., h]."""
        P = self.head_dim
        if P == 1:
            return q * z
        b, l, _ = q.shape
        qh = q.reshape(b, l, self.n_heads, P)
        if P <= SMALL_HEAD:  # Σ_i q_i z_ij as P² products of (b, l, H) slices, not b·l·H products of P x P
            qs, zs = qh.unbind(-1), z.reshape(b, P * P, l, self.n_heads).unbind(1)
            cols = []
            for j in range(P):
                col = qs[0] * zs[j]
                for i in range(1, P):
                    col = torch.addcmul(col, qs[i], zs[i * P + j])
                cols.append(col)
            return torch.stack(cols, dim=2).reshape(b, l, P * self.n_heads)
        o = torch.einsum("blhi,bijlh->bljh", qh, z.reshape(b, P, P, l, self.n_heads))
        return o.reshape(b, l, P * self.n_heads)

    def _inner_mask(self, mask: Tensor | None) -> Tensor | None:
        if mask is None or self.head_dim == 1:
            return mask
        return mask.repeat_interleave(self.head_dim**2, dim=0)

    # ---- modes --------------------------------------------------------------------------------

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x (batch, length, d_model) -> same shape; ``mask`` (batch, length), True at real positions."""
        self._check_input(x)
        if self.directions is not None:
            return self.directions(x, mask)
        x = apply_mask(x, mask)
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        k = self.shift(apply_mask(k, mask))
        z = self.inner(self._kv(k, v), self._inner_mask(mask))
        return self.out_proj(self._gate(q, z))

    def default_state(self, batch_size: int, device=None, dtype=None) -> dict[str, Any]:
        """``{"keys": (batch, d_model, d_state - 1) zeros, "inner": the inner primitive's state for
        batch · head_dim² sequences}``."""
        self._check_step()
        device = device if device is not None else self.shift_C.device
        dtype = dtype if dtype is not None else self.shift_C.dtype
        keys = torch.zeros(batch_size, self.d_model, self.d_state - 1, device=device, dtype=dtype)
        inner = self.inner.default_state(batch_size * self.head_dim**2, device=device, dtype=dtype)
        return {"keys": keys, "inner": inner}

    def step(self, x: Tensor, state: dict[str, Any]) -> tuple[Tensor, dict[str, Any]]:
        """One position: x (batch, d_model) -> (y (batch, d_model), new state)."""
        self._check_step()
        if x.dim() != 2 or x.shape[-1] != self.d_model:
            raise ValueError(f"H3.step expects x of shape (batch, {self.d_model}), got {tuple(x.shape)}")
        expected = (x.shape[0], self.d_model, self.d_state - 1)
        if not isinstance(state, dict) or tuple(state.get("keys", torch.empty(0)).shape) != expected:
            raise ValueError(f"H3.step: state['keys'] must have shape {expected} (see default_state)")
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        window = torch.cat([state["keys"], k.unsqueeze(-1)], dim=-1)  # (b, d, N): k_{t-N+1} .. k_t
        k_bar = (window * self.shift_C[0].flip(-1)).sum(-1) + self.shift_D * k
        z, inner_state = self.inner.step(self._kv(k_bar.unsqueeze(1), v.unsqueeze(1)).squeeze(1), state["inner"])
        o = self._gate(q.unsqueeze(1), z.unsqueeze(1)).squeeze(1)
        return self.out_proj(o), {"keys": window[..., 1:], "inner": inner_state}
