"""The Linear Recurrent Unit (LRU; Orvieto, Smith, Gu, Fernando, Gulcehre, Pascanu & De, "Resurrecting
Recurrent Neural Networks for Long Sequences", ICML 2023, arXiv 2303.06349).

A complex diagonal linear recurrence with state size N = ``d_state`` between input and output of
width H = ``d_model``::

    x_t = λ ⊙ x_{t-1} + γ ⊙ (B u_t),        x_{-1} = 0
    y_t = Re(C x_t) + D ⊙ u_t

with λ ∈ C^N, γ ∈ R^N (positive), B ∈ C^{N×H}, C ∈ C^{H×N}, D ∈ R^H and:

* exponential parameterisation: ``λ = exp(-exp(ν_log) + i·exp(θ_log))``, so |λ| = exp(-exp(ν_log))
  < 1 for every value of the trained ν_log (the recurrence is stable by construction) and the
  phase is exp(θ_log) > 0;
* ring initialisation: |λ| uniform by area on the ring r_min <= |λ| < r_max,
  ``|λ|² = U (r_max² - r_min²) + r_min²`` with U ~ U[0, 1), i.e.
  ``ν = exp(ν_log) = -½ log(U (r_max² - r_min²) + r_min²)``; phase ``θ = max_phase · U'`` with
  U' ~ U(0, 1], so θ ∈ (0, max_phase] (θ_log = log θ);
* γ normalisation: ``γ = exp(γ_log)``, initialised at ``sqrt(1 - |λ|²)`` and trained. For white
  noise u of unit variance, E|(B u)_n|² = 1 at init and the stationary state variance is
  ``γ² / (1 - |λ|²) = 1``: the state keeps the scale of the input however close |λ| is to 1;
* the paper's Glorot-style init: Re B, Im B ~ N(0, 1/(2H)) (the factor 2 because the real part
  of the output halves the variance), Re C, Im C ~ N(0, 1/N), D ~ N(0, 1).

The defaults are those of the paper's appendix A implementation: r_min 0, r_max 1, max_phase
2π (the code writes 6.28). On the Long Range Arena they are set per task; the presets under
``presets/lru/`` give per-task values (their descriptions say where each comes from).

Parallel mode: the states of the recurrence come from
:func:`longrange.ops.complex_scan.complex_diag_scan`, the implementation chosen by the ``impl``
option (None: the scan's default, normally ``"auto"``: the chunked scan stepping within chunks on
CPUs, by matrix products within chunks elsewhere; each tested against the loop over time in
complex128); the projections B u and Re(C x) are real matrix products on the (real, imaginary)
parts. The step mode applies the recurrence once; stepping through a sequence gives the forward's outputs.
The state is complex (N,) per sequence (2N real numbers in :meth:`state_size`), zero at the
start. Computation runs in the wider of the input's dtype and float32 (float64 for float64
parameters or inputs); under autocast the two projections are autocast matrix products while the
recurrence stays in float32 (complex64).

Bidirectional (``bidirectional=True``): the bidirectional form of the S5 code base (Smith,
Warrington & Linderman, arXiv 2208.04933), kept by the public LRU reproductions on the Long Range
Arena built on it: one λ, γ and B shared by both directions, the same input run through the
recurrence forward and backward (the backward scan ``x^b_t = λ x^b_{t+1} + γ B u_t`` includes
position t), and a second output matrix for the backward states::

    y_t = Re(C_fwd x^f_t + C_bwd x^b_t) + D ⊙ u_t

C is stored as (directions, H, N) with the backward matrix second, as the bidirectional kernels
of S4D. (The flip-and-sum of two independent causal layers that S6 and the matrix-state layers
use would double λ, γ, B and D.) This form follows that code base, not a statement of the LRU
paper. :meth:`LRU.causal_directions` gives the two causal layers whose sum (the backward one run
on the reversed sequence) is the bidirectional layer.

Padding: the input is zeroed at padded positions (at the end of each sequence) before the
recurrence, so the backward scan reaches the last real position from a zero state and the
outputs at real positions do not depend on the amount of padding.

Optimiser hints (:func:`~longrange.layers.base.set_optim_hint`): ν_log, θ_log and γ_log, the
recurrent parameters, are in the ``ssm`` group (``SSM_GROUP``): trained at ``train.ssm_lr_scale``
times the learning rate with ``train.ssm_weight_decay`` (the trainer's defaults: 0.1 and no
weight decay), or at the learning-rate scale pinned by the layer's ``ssm_lr_scale`` option. The
public JAX reproduction (NicolasZucchet/minimal-LRU) trains the recurrent parameters at a
reduced learning rate (0.5 times by default) without weight decay, and B with them. B, C and D
carry no hint here: they train at the main learning rate and weight decay, as that reproduction
trains C and D; a preset trains B with the recurrent parameters by a ``train.param_groups`` rule
on ``*.B``.

In a model: the paper's block, as the public JAX reproduction writes it (minimal-LRU
``lru/model.py``), is norm → LRU → GELU → dropout → ``out1(x) · sigmoid(out2(x))`` → dropout →
residual, pre-norm. The toolkit's ``block: simple`` with ``prenorm: true`` is the same
computation: its ``Linear(d, 2d)`` followed by GLU computes ``a · sigmoid(b)`` for the two halves
of one linear map (out1 and out2 stacked), and its dropout drops whole features at every
position, as the reproduction's (broadcast over time). Three differences: our GELU is exact
(flax's default is the tanh approximation; they differ by less than 5e-4), the output maps start
from PyTorch's Linear init (flax Dense: LeCun normal, zero bias), and batch norm keeps running
statistics with PyTorch's momentum 0.1 (flax: 0.99, i.e. 0.01 of each batch), which changes
evaluation statistics only.

Parameters per layer: 3N (ν_log, θ_log, γ_log) + 2NH (B) + 2NH per direction (C) + H (D).
"""

from __future__ import annotations

import math
from numbers import Real
from typing import ClassVar

import torch
from torch import Tensor, nn

from longrange.errors import ConfigError
from longrange.layers.base import SSM_GROUP, SequencePrimitive, apply_mask, set_optim_hint
from longrange.layers.registry import register_primitive
from longrange.layers.ssm import as_complex, check_positive_int, check_step_input, complex_dtype_of
from longrange.ops.complex_scan import check_impl, complex_diag_scan

_WHERE = "LRU"


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise ConfigError(f"{_WHERE}: {name} must be a finite number, got {value!r}")
    return float(value)


def check_ring(r_min: object, r_max: object, max_phase: object) -> tuple[float, float, float]:
    """(r_min, r_max, max_phase) as floats; ConfigError naming the option unless
    0 <= r_min < r_max <= 1 and max_phase > 0."""
    lo, hi, phase = _number("r_min", r_min), _number("r_max", r_max), _number("max_phase", max_phase)
    if lo < 0:
        raise ConfigError(f"{_WHERE}: r_min must be >= 0 (the inner radius of the ring |λ| is drawn from), got {lo!r}")
    if not 0 < hi <= 1:
        raise ConfigError(f"{_WHERE}: r_max must be in (0, 1] (|λ| < 1 keeps the recurrence stable), got {hi!r}")
    if lo >= hi:
        raise ConfigError(
            f"{_WHERE}: r_min must be < r_max (the ring r_min <= |λ| < r_max), got r_min={lo!r}, r_max={hi!r}"
        )
    if phase <= 0:
        raise ConfigError(
            f"{_WHERE}: max_phase must be > 0 (the phases of λ are drawn in (0, max_phase]), got {phase!r}"
        )
    return lo, hi, phase


def ring_init(n: int, r_min: float, r_max: float, max_phase: float) -> tuple[Tensor, Tensor, Tensor]:
    """(ν_log, θ_log, γ_log), each (n,) float64: λ uniform by area on the ring r_min <= |λ| < r_max
    with phase in (0, max_phase], and γ = sqrt(1 - |λ|²) (see the module docstring)."""
    r_min, r_max, max_phase = check_ring(r_min, r_max, max_phase)
    # U in (0, 1): |λ|² > 0 keeps ν finite when r_min = 0 (and < r_max² <= 1 keeps it positive).
    u1 = torch.rand(n, dtype=torch.float64).clamp_(min=2.0**-53)
    mod_sq = u1 * (r_max**2 - r_min**2) + r_min**2  # |λ|²
    nu_log = torch.log(-0.5 * torch.log(mod_sq))
    u2 = 1.0 - torch.rand(n, dtype=torch.float64)  # (0, 1]: θ > 0 keeps θ_log finite
    theta_log = torch.log(max_phase * u2)
    gamma_log = 0.5 * torch.log1p(-mod_sq)  # log sqrt(1 - |λ|²), without cancellation near |λ| = 1
    return nu_log, theta_log, gamma_log


def _recurrent_parameter(value: Tensor, lr_scale: float | None) -> nn.Parameter:
    p = nn.Parameter(value.to(torch.get_default_dtype()))
    return set_optim_hint(p, SSM_GROUP, **({} if lr_scale is None else {"lr_scale": lr_scale}))


@register_primitive("lru")
class LRU(SequencePrimitive):
    """Linear Recurrent Unit (see the module docstring for the recurrence, init and options).

    Args:
        d_model: input and output width H.
        d_state: complex state size N (any positive integer; N complex numbers per sequence).
        r_min, r_max: the ring of the initial |λ|: 0 <= r_min < r_max <= 1.
        max_phase: the initial phases of λ are uniform in (0, max_phase]; > 0.
        bidirectional: add the backward scan with its own output matrix (module docstring).
        ssm_lr_scale: if given, pins the learning-rate scale of ν_log, θ_log and γ_log in their hint;
            otherwise the trainer's ``ssm`` group setting applies.
        chunk_size: the chunk length of the chunked scan (None: the implementation's default).
        impl: the scan's implementation (:data:`longrange.ops.complex_scan.IMPLS`: ``"auto"``,
            ``"chunk"``, ``"loop"``, ``"ref"``; None: the process default, see
            :func:`longrange.ops.complex_scan.set_default_impl`). Results agree up to rounding.

    Parameters: ``nu_log``, ``theta_log``, ``gamma_log`` (N,); ``B`` (N, H, 2) and ``C``
    (directions, H, N, 2), complex stored as (real, imaginary) pairs (so ``.double()`` converts
    them and every optimiser treats both parts alike); ``D`` (H,).
    """

    OPTION_NOTES: ClassVar[dict[str, str]] = {
        "ssm_lr_scale": "not pinned: train.ssm_lr_scale applies",
        "chunk_size": "the scan implementation's default (loop 32, chunk 64)",
        "impl": 'the op\'s default for the process: "auto" unless changed by its set_default_impl',
    }

    def __init__(
        self,
        d_model: int,
        d_state: int = 64,
        r_min: float = 0.0,
        r_max: float = 1.0,
        max_phase: float = 2 * math.pi,
        bidirectional: bool = False,
        ssm_lr_scale: float | None = None,
        chunk_size: int | None = None,
        impl: str | None = None,
    ):
        super().__init__()
        check_positive_int("d_model", d_model, where=_WHERE)
        check_positive_int("d_state", d_state, where=_WHERE)
        self.r_min, self.r_max, self.max_phase = check_ring(r_min, r_max, max_phase)
        if ssm_lr_scale is not None and _number("ssm_lr_scale", ssm_lr_scale) <= 0:
            raise ConfigError(f"{_WHERE}: ssm_lr_scale must be None or > 0, got {ssm_lr_scale!r}")
        if chunk_size is not None and (
            isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 2
        ):
            raise ConfigError(f"{_WHERE}: chunk_size must be None or an integer >= 2, got {chunk_size!r}")
        check_impl(impl, _WHERE)
        self.d_model, self.d_state, self.bidirectional = d_model, d_state, bool(bidirectional)
        self.ssm_lr_scale, self.chunk_size, self.impl = ssm_lr_scale, chunk_size, impl
        H, N = d_model, d_state
        directions = 2 if self.bidirectional else 1

        nu_log, theta_log, gamma_log = ring_init(N, self.r_min, self.r_max, self.max_phase)
        self.nu_log = _recurrent_parameter(nu_log, ssm_lr_scale)
        self.theta_log = _recurrent_parameter(theta_log, ssm_lr_scale)
        self.gamma_log = _recurrent_parameter(gamma_log, ssm_lr_scale)
        dtype = torch.get_default_dtype()
        # Re, Im of B ~ N(0, 1/(2H)); of C ~ N(0, 1/N); D ~ N(0, 1).
        self.B = nn.Parameter((torch.randn(N, H, 2, dtype=torch.float64) / math.sqrt(2 * H)).to(dtype))
        self.C = nn.Parameter((torch.randn(directions, H, N, 2, dtype=torch.float64) / math.sqrt(N)).to(dtype))
        self.D = nn.Parameter(torch.randn(H, dtype=torch.float64).to(dtype))

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, d_state={self.d_state}, r_min={self.r_min:g}, r_max={self.r_max:g}, "
            f"max_phase={self.max_phase:g}, bidirectional={self.bidirectional}"
        )

    # -- the recurrence's pieces ----------------------------------------------------------

    def log_lambda(self) -> Tensor:
        """(N,) complex: log λ = -exp(ν_log) + i·exp(θ_log)."""
        return torch.complex(-torch.exp(self.nu_log), torch.exp(self.theta_log))

    def ssm(self) -> tuple[Tensor, Tensor, Tensor]:
        """(log λ (N,), γ ⊙ B (N, H), C (directions, H, N)), complex in the parameters' precision."""
        B = as_complex(self.B) * torch.exp(self.gamma_log)[:, None]
        return self.log_lambda(), B, as_complex(self.C)

    def _work_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return torch.promote_types(torch.promote_types(dtype, self.nu_log.dtype), torch.float32)

    def _in_proj(self, u: Tensor, work: torch.dtype) -> Tensor:
        """γ ⊙ (B u): u (..., H) real -> (..., N) complex, by one real product with the interleaved
        (real, imaginary) rows of γB."""
        W = (self.B * torch.exp(self.gamma_log)[:, None, None]).transpose(1, 2).reshape(2 * self.d_state, self.d_model)
        v = torch.matmul(u, W.to(u.dtype).t()).to(work)
        return torch.view_as_complex(v.unflatten(-1, (self.d_state, 2)))

    def _out_weight(self, direction: int) -> Tensor:
        """(H, 2N): Re(C x) = this · (Re x_1, Im x_1, Re x_2, ...), i.e. rows (Re C, -Im C) interleaved."""
        C = self.C[direction]
        return (C * C.new_tensor([1.0, -1.0])).flatten(-2)

    def _out_proj(self, xs: list[Tensor], u: Tensor) -> Tensor:
        """Re(Σ_k C_k x^k) + D ⊙ u for the states x^k (..., N) of each direction."""
        states = torch.cat([torch.view_as_real(x).flatten(-2) for x in xs], dim=-1)
        W = torch.cat([self._out_weight(k) for k in range(len(xs))], dim=-1)
        y = torch.matmul(states, W.to(states.dtype).t()).to(u.dtype)
        return y + self.D.to(u.dtype) * u

    # -- modes ----------------------------------------------------------------------------

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """x (batch, length, d_model) -> same shape; ``mask`` (batch, length), True at real positions."""
        self._check_input(x)
        work = self._work_dtype(x.dtype)
        u = apply_mask(x, mask).to(work)
        v = self._in_proj(u, work)  # (batch, length, N) complex
        log_lam = self.log_lambda().to(v.dtype)
        scan = dict(chunk_size=self.chunk_size, impl=self.impl)
        xs = [complex_diag_scan(log_lam, v, **scan)]
        if self.bidirectional:
            xs.append(complex_diag_scan(log_lam, v, reverse=True, **scan))
        return self._out_proj(xs, u).to(x.dtype)

    def default_state(self, batch_size: int, device=None, dtype=None) -> Tensor:
        """Zero state (batch, d_state), complex (complex64 for float32, complex128 for float64)."""
        self._check_step()
        dtype = complex_dtype_of(self._work_dtype(dtype or self.nu_log.dtype))
        return torch.zeros(batch_size, self.d_state, dtype=dtype, device=device or self.nu_log.device)

    def step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """One position: x (batch, d_model) -> (y (batch, d_model), new state); ``x_t = λ x_{t-1} + γ B u_t``."""
        self._check_step()
        check_step_input(self, x, state, (self.d_state,))
        work = self._work_dtype(x.dtype)
        u = x.to(work)
        v = self._in_proj(u, work)
        state = torch.exp(self.log_lambda()).to(v.dtype) * state.to(v.dtype) + v
        return self._out_proj([state], u).to(x.dtype), state

    def causal_directions(self) -> tuple[LRU, LRU]:
        """The two causal layers of a bidirectional LRU: (forward, backward), copies of its λ, γ and B
        with the forward or the backward output matrix; the backward one without the skip D. For
        any x: ``self(x) == fwd(x) + bwd(x.flip(1)).flip(1)`` (the backward part is not shifted)."""
        if not self.bidirectional:
            raise ValueError("LRU.causal_directions: the layer is causal; only a bidirectional LRU has two directions")
        state = self.state_dict()
        layers = []
        for k in range(2):
            with torch.random.fork_rng(devices=[]):  # the throwaway init leaves the global generator alone
                layer = LRU(
                    self.d_model,
                    self.d_state,
                    self.r_min,
                    self.r_max,
                    self.max_phase,
                    bidirectional=False,
                    ssm_lr_scale=self.ssm_lr_scale,
                    chunk_size=self.chunk_size,
                    impl=self.impl,
                )
            layer = layer.to(device=self.nu_log.device, dtype=self.nu_log.dtype)
            D = state["D"] if k == 0 else torch.zeros_like(state["D"])
            layer.load_state_dict({**state, "C": state["C"][k : k + 1], "D": D})
            layers.append(layer.train(self.training))
        return layers[0], layers[1]


__all__ = ["LRU", "check_ring", "ring_init"]
