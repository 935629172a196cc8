"""RWKV-4's time mixing (Peng et al., "RWKV: Reinventing RNNs for the Transformer Era", arXiv
2305.13048) as a sequence primitive, the RWKV of Zoology's Figure 2 (HazyResearch/zoology
``zoology/mixers/rwkv.py``, ``RWKVTimeMixer``, a copy of BlinkDL/RWKV-LM's v4 layer).

The layer, per channel, with x_{-1} = 0 (the token shift)::

    xk = μ_k x_t + (1 - μ_k) x_{t-1}      (likewise xv with μ_v, xr with μ_r)
    k, v, r = W_k xk, W_v xv, W_r xr        (linear maps without bias, d x d)
    y_t = W_o (sigmoid(r) ⊙ wkv_t)

``wkv_t`` is RWKV-4's decaying weighted average of the values (:mod:`longrange.ops.wkv`: compiled
loops on CPUs, a chunked scan elsewhere, each against its loop over time) with the decay rate
``exp(time_decay)`` per channel and the bonus ``time_first`` for the current token.

Initialisation, as the layer's code sets it from the layer's index ``i`` and the number of layers
``n`` (``ratio_0_to_1 = i / (n - 1)``, 0 for one layer; ``ratio_1_to_almost0 = 1 - i / n``), with
``x_c = c / d`` for channel c:

* ``time_decay_c = -5 + 8 (c / (d - 1))^(0.7 + 1.3 ratio_0_to_1)`` (decay rates from e^-5 to e^3);
* ``time_first_c = log 0.3 + 0.5 ((c + 1) mod 3 - 1)`` (a zigzag);
* ``μ_k = x^ratio_1_to_almost0``, ``μ_v = x^ratio_1_to_almost0 + 0.3 ratio_0_to_1``,
  ``μ_r = x^(0.5 ratio_1_to_almost0)``;
* the four linear maps as PyTorch initialises them (the RWKV code's own scheme, ``init_rwkv``, is
  not called by Zoology, whose models are re-initialised by ``model.init``).

The index is the layer's place among the model's sequence-mixing layers: the backbone sets it
(:meth:`RWKV.place_in_stack`; a stack's channel-mixer layers, which RWKV's blocks hold beside their
time mixing, are not counted), and a layer built alone is layer 0. ``init_layers`` sets ``n``
(None: the number of those layers). Zoology builds the layer without ``n_layer``, so its default
12 applies there (``zoology/mqar/rwkv``).

Bidirectional (``bidirectional=True``): two causal layers, the second over the reversed sequence,
summed (as S6). Step mode: the previous input and the WKV state (numerator, denominator and their
log-scale per channel: 4 d numbers); ``step`` == ``forward``. Padded positions are zeroed on input
(the token shift reads zeros there) and add nothing to the WKV's sums, so a reversed sequence's
leading padding leaves its first real position as without padding.

The WKV here runs in the wider of the input's dtype and float32; Zoology's kernel returns it (and
its gradients) rounded to bfloat16 (``RWKV_FLOAT_MODE = 'bf16'``).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor, nn

from longrange.errors import ConfigError
from longrange.layers.mixer_parts import RecurrentMixer
from longrange.layers.registry import register_primitive
from longrange.layers.ssm import check_positive_int
from longrange.ops import wkv as wkv_op

_WHERE = "RWKV"


def _ratios(index: int, n_layers: int) -> tuple[float, float]:
    """(ratio_0_to_1, ratio_1_to_almost0) of the RWKV code's initialisation."""
    return (index / (n_layers - 1) if n_layers > 1 else 0.0), 1.0 - index / n_layers


def time_mixing_init(d_model: int, index: int, n_layers: int) -> dict[str, Tensor]:
    """The RWKV-4 time-mixing parameters of layer ``index`` of ``n_layers`` (module docstring),
    float64: ``time_decay``, ``time_first``, ``mix_k``, ``mix_v``, ``mix_r``, each (d_model,)."""
    up, down = _ratios(index, n_layers)
    c = torch.arange(d_model, dtype=torch.float64)
    decay = -5 + 8 * (c / max(d_model - 1, 1)) ** (0.7 + 1.3 * up)
    zigzag = 0.5 * (((c.long() + 1) % 3) - 1).double()
    x = c / d_model
    return {
        "time_decay": decay,
        "time_first": math.log(0.3) + zigzag,
        "mix_k": x**down,
        "mix_v": x**down + 0.3 * up,
        "mix_r": x ** (0.5 * down),
    }


@register_primitive("rwkv")
class RWKV(RecurrentMixer):
    """RWKV-4 time mixing (see the module docstring).

    Args:
        d_model: input and output width d (the WKV runs per channel).
        init_layers: ``n`` of the initialisation; None: the model's sequence-mixing layers (1 alone).
        bidirectional: two causal layers summed, the second over the reversed sequence.
        chunk_size: the chunk length of the chunked WKV's scan (None: the scan's default).
        impl: the WKV's implementation (:data:`longrange.ops.wkv.IMPLS`: ``"auto"``, ``"numba"``,
            ``"chunked"``, ``"ref"``; None: the process default, normally ``"auto"``: numba on CPUs).

    Parameters: ``time_decay``, ``time_first``, ``mix_k``, ``mix_v``, ``mix_r`` (d,); ``key``,
    ``value``, ``receptance``, ``output`` (d x d, no bias): 4 d² + 5 d.
    """

    OPTION_NOTES: ClassVar[dict[str, str]] = {
        "init_layers": "the model's number of sequence-mixing layers (1 for a layer built alone)",
        "chunk_size": "the scan's default",
        "impl": 'the op\'s default for the process: "auto" unless changed by its set_default_impl',
    }

    def __init__(
        self,
        d_model: int,
        init_layers: int | None = None,
        bidirectional: bool = False,
        chunk_size: int | None = None,
        impl: str | None = None,
    ):
        super().__init__()
        check_positive_int("d_model", d_model, where=_WHERE)
        if init_layers is not None:
            check_positive_int("init_layers", init_layers, where=_WHERE)
        if chunk_size is not None:
            check_positive_int("chunk_size", chunk_size, where=_WHERE)
        wkv_op.DISPATCHER.check_option(impl, _WHERE)
        self.d_model, self.bidirectional = d_model, bool(bidirectional)
        self.layer_index, self.init_layers, self.chunk_size, self.impl = 0, init_layers, chunk_size, impl
        if self._init_directions(
            (lambda: RWKV(d_model, init_layers, chunk_size=chunk_size, impl=impl)) if self.bidirectional else None
        ):
            return
        dtype = torch.get_default_dtype()
        for name, value in time_mixing_init(d_model, 0, init_layers or 1).items():
            setattr(self, name, nn.Parameter(value.to(dtype)))
        self.key = nn.Linear(d_model, d_model, bias=False)
        self.value = nn.Linear(d_model, d_model, bias=False)
        self.receptance = nn.Linear(d_model, d_model, bias=False)
        self.output = nn.Linear(d_model, d_model, bias=False)

    def extra_repr(self) -> str:
        n = self.init_layers
        return (
            f"d_model={self.d_model}, layer_index={self.layer_index}, init_layers={n if n else 'model'}, "
            f"bidirectional={self.bidirectional}"
        )

    @torch.no_grad()
    def place_in_stack(self, index: int, n_layers: int) -> None:
        """Set the layer's index among a model's ``n_layers`` sequence-mixing layers (the backbone calls it) and
        redraw the initialisation that depends on it (no random numbers: the linear maps stay)."""
        if self.bidirectional:
            self.directions.fwd.place_in_stack(index, n_layers)
            self.directions.bwd.place_in_stack(index, n_layers)
            self.layer_index = index
            return
        n = self.init_layers or n_layers
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"{_WHERE}.place_in_stack: the index must be an integer >= 0, got {index!r}")
        if index >= n:
            raise ConfigError(f"{_WHERE}: layer {index} of the model is not below init_layers {n} (the layers counted)")
        self.layer_index = index
        for name, value in time_mixing_init(self.d_model, index, n).items():
            getattr(self, name).copy_(value)

    def _projections(self, x: Tensor, shifted: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        def mixed(mu: Tensor) -> Tensor:
            mu = mu.to(x.dtype)
            return x * mu + shifted * (1 - mu)

        return (
            self.key(mixed(self.mix_k)),
            self.value(mixed(self.mix_v)),
            torch.sigmoid(self.receptance(mixed(self.mix_r))),
        )

    def _decay(self) -> tuple[Tensor, Tensor]:
        return torch.exp(self.time_decay), self.time_first

    def _mix(self, x: Tensor, mask: Tensor | None) -> Tensor:
        shifted = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)
        k, v, r = self._projections(x, shifted)
        y = wkv_op.wkv(*self._decay(), k, v, mask=mask, chunk_size=self.chunk_size, impl=self.impl)
        return self.output(r * y.to(r.dtype))

    def _zero_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> dict[str, Tensor]:
        work = torch.promote_types(dtype, torch.float32)
        return {
            "x": torch.zeros(batch_size, self.d_model, device=device, dtype=dtype),
            **wkv_op.empty_state(batch_size, self.d_model, device=device, dtype=work),
        }

    def _step(self, x: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        if not isinstance(state, dict) or "x" not in state:
            raise ValueError(f"{_WHERE}.step: the state is a dict of x, {', '.join(wkv_op.STATE_KEYS)}, got {state!r}")
        if tuple(state["x"].shape) != tuple(x.shape):
            raise ValueError(
                f"{_WHERE}.step: state['x'] has shape {tuple(state['x'].shape)}, the input {tuple(x.shape)}"
            )
        k, v, r = self._projections(x, state["x"].to(x.dtype))
        y, wkv_state = wkv_op.wkv_step(*self._decay(), k, v, {key: state[key] for key in wkv_op.STATE_KEYS})
        return self.output(r * y.to(r.dtype)), {"x": x, **wkv_state}


__all__ = ["RWKV", "time_mixing_init"]
