"""S4: SSMs with a diagonal-plus-low-rank state matrix initialised from HiPPO-LegS.

Per channel, in the LegS eigenbasis (see :func:`longrange.layers.hippo.legs_nplr`):
``A = diag(Λ) - P Q^H`` with Q = P by default (the NPLR tie of S4; ``tie_pq=False`` learns Q
separately, initialised equal to P). Λ, P, B and the output vector are stored for one member of
each conjugate pair (N/2 entries); the system they describe is the conjugate-complete one of size
N, so its kernel is real. Discretisation is bilinear in both modes.

The output vector is learnt as C̃ = C (I - Ā^{l_max}) (as in the S4 paper), which makes the
kernel of length ``l_max`` one inverse FFT of the generating function
(:func:`longrange.ops.ssm_kernels.dplr_generating_kernel`). Lengths other than ``l_max``:

* L <= l_max: the length-l_max kernel is computed and truncated (the first L taps of the kernel
  of C are exact).
* L > l_max: C̃ is converted to the C̃ of the next length l_max·2^k >= L with
  ``I - Ā^{2T} = (I - Ā^T)(I + Ā^T)`` (dense Ā^T by repeated squaring; no inverse), then the
  kernel is truncated. The parameter itself is not changed.

The recurrent mode recovers C = C̃ (I - Ā^{l_max})^{-1} for the same ``l_max`` and runs the dense
bilinear recurrence, so stepping reproduces ``forward`` for any length.

Tying across channels (as the S4 code's ``n_ssm``): Λ, P, B (and Q when untied) are stored in
``n_ssm`` copies, channel h using copy h mod n_ssm; Δ and C̃ stay per channel (the code's ``inv_dt``
and C have H entries whatever n_ssm). ``n_ssm_A`` sets the copies of Λ alone: the original S4 code
(tag v1) keeps one Λ for all channels with B, P and Q per channel (``n_ssm_A=1, tie_pq=False``).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor

from longrange.layers.hippo import legs_nplr
from longrange.layers.registry import register_primitive
from longrange.layers.ssm import (
    REAL_TRANSFORMS,
    ConvolutionalSSM,
    as_complex,
    check_choice,
    check_copies,
    check_positive_int,
    check_state_size,
    check_step_input,
    decode_dt,
    decode_real_part,
    dt_parameter,
    encode_real_part,
    real_param,
    sample_log_dt,
    skip_init,
    skip_parameter,
    ssm_parameter,
    tile_channels,
)
from longrange.ops.ssm_kernels import (
    bilinear_dense,
    c_tilde_to_c,
    complete_conj,
    dplr_dense,
    dplr_generating_kernel,
)


@register_primitive("s4")
class S4(ConvolutionalSSM):
    """The S4 layer (Gu, Goel & Ré, 2022) with the NPLR-LegS parameterisation.

    Args:
        d_model: channels H.
        d_state: full state size N (even); N/2 conjugate pairs are stored.
        rank: rank r of the low-rank term (LegS needs 1; extra rows start at zero).
        l_max: the length C̃ is defined for (see the module doc); the natural choice is the
            training sequence length.
        dt_min, dt_max: range of the log-uniform Δ init.
        bidirectional: a second C̃ gives the backward kernel of a two-sided convolution.
        tie_pq: Q = P (default, as S4) or a separate trainable Q.
        real_transform: parameterisation of Re Λ: ``exp`` (-exp(raw)), ``relu`` or ``none``.
        d_init: skip D init (``ones``, ``zeros``, ``randn``).
        ssm_lr_scale: optional pinned learning-rate scale for the SSM parameters.
        n_ssm: trainable copies of (Λ, P, B), and Q when untied, shared across the channels
            (a divisor of d_model; None = one per channel). Δ and C̃ stay per channel.
        n_ssm_A: trainable copies of Λ alone (a divisor of d_model; None = n_ssm).
        dt_transform: how Δ is stored: ``exp`` (``log_dt``, Δ = exp) or ``softplus`` (``inv_dt``,
            Δ = softplus, the newer S4 code's default); the init range is the same.

    Parameters, with S = n_ssm and S_A = n_ssm_A (both H by default): H (Δ) + S_A·N (Λ) + r·S·N
    (P; twice when Q is untied) + S·N (B) + H·N (C̃, 2H·N if bidirectional) + H (D).
    """

    OPTION_NOTES: ClassVar[dict[str, str]] = {
        "ssm_lr_scale": "not pinned: train.ssm_lr_scale applies",
        "n_ssm": "d_model: one copy per channel",
        "n_ssm_A": "n_ssm",
    }

    def __init__(
        self,
        d_model: int,
        d_state: int = 64,
        rank: int = 1,
        l_max: int = 1024,
        dt_min: float = 0.001,
        dt_max: float = 0.1,
        bidirectional: bool = False,
        tie_pq: bool = True,
        real_transform: str = "exp",
        d_init: str = "ones",
        ssm_lr_scale: float | None = None,
        n_ssm: int | None = None,
        n_ssm_A: int | None = None,
        dt_transform: str = "exp",
    ):
        super().__init__()
        check_positive_int("d_model", d_model)
        check_state_size(d_state)
        check_positive_int("rank", rank)
        check_positive_int("l_max", l_max)
        check_choice("real_transform", real_transform, REAL_TRANSFORMS)
        copies = check_copies("n_ssm", n_ssm, d_model)
        copies_A = copies if n_ssm_A is None else check_copies("n_ssm_A", n_ssm_A, d_model)
        self.d_model, self.d_state, self.rank, self.l_max = d_model, d_state, rank, l_max
        self.bidirectional, self.tie_pq, self.real_transform = bool(bidirectional), bool(tie_pq), real_transform
        self.n_ssm, self.n_ssm_A = copies, copies_A
        H, M = d_model, d_state // 2

        Lambda, P, B, _ = legs_nplr(d_state, rank)
        channels = 2 if self.bidirectional else 1
        self.dt_name, raw_dt = dt_parameter(sample_log_dt(H, dt_min, dt_max), dt_transform)
        self.dt_transform = dt_transform
        setattr(self, self.dt_name, ssm_parameter(raw_dt, ssm_lr_scale))
        self.Lambda_real = ssm_parameter(
            encode_real_part(Lambda.real.expand(copies_A, M), real_transform), ssm_lr_scale
        )
        self.Lambda_imag = ssm_parameter(Lambda.imag.expand(copies_A, M).clone(), ssm_lr_scale)
        self.P = ssm_parameter(real_param(P.unsqueeze(1).expand(rank, copies, M)), ssm_lr_scale)
        if not self.tie_pq:
            self.Q = ssm_parameter(real_param(P.unsqueeze(1).expand(rank, copies, M)), ssm_lr_scale)
        self.B = ssm_parameter(real_param(B.expand(copies, M)), ssm_lr_scale)
        self.C_tilde = ssm_parameter(real_param(torch.randn(channels, H, M, dtype=torch.complex128)), ssm_lr_scale)
        self.D = skip_parameter(skip_init(H, d_init))
        self._step_cache: tuple | None = None

    # -- SSM pieces -----------------------------------------------------------------------

    def ssm(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(dt (H,), Λ (H, N/2), P (r, H, N/2), Q (r, H, N/2), B (H, N/2), C̃ (channels, H, N/2)),
        the tied parameters tiled to the H channels."""
        H = self.d_model
        Lambda = torch.complex(decode_real_part(self.Lambda_real, self.real_transform), self.Lambda_imag)
        P = tile_channels(as_complex(self.P), H, 1)
        Q = P if self.tie_pq else tile_channels(as_complex(self.Q), H, 1)
        dt = decode_dt(getattr(self, self.dt_name), self.dt_transform)
        B = tile_channels(as_complex(self.B), H, 0)
        return dt, tile_channels(Lambda, H, 0), P, Q, B, as_complex(self.C_tilde)

    def dense_ssm(self) -> tuple[Tensor, Tensor, Tensor]:
        """Conjugate-complete bilinear (Ā (H, N, N), B̄ (H, N)) and C̃ (channels, H, N)."""
        dt, Lambda, P, Q, B, C_tilde = self.ssm()
        A = dplr_dense(complete_conj(Lambda), complete_conj(P), complete_conj(Q))
        dA, dB = bilinear_dense(dt, A, complete_conj(B))
        return dA, dB, complete_conj(C_tilde)

    def kernel(self, L: int) -> Tensor:
        """(channels, H, L) real kernel of the SSM with C = C̃ (I - Ā^{l_max})^{-1}."""
        check_positive_int("L", L)
        dt, Lambda, P, Q, B, C_tilde = self.ssm()
        length = self.l_max
        if L > self.l_max:
            doublings = math.ceil(math.log2(L / self.l_max))
            dA, _, C_full = self.dense_ssm()
            power = torch.linalg.matrix_power(dA, self.l_max)
            for _ in range(doublings):
                C_full = C_full + torch.einsum("chn,hnm->chm", C_full, power)  # C̃ (I + Ā^T)
                power = power @ power
                length *= 2
            C_tilde = C_full[..., : self.d_state // 2]
        K = dplr_generating_kernel(dt, Lambda, P, Q, B, C_tilde, length, conj_pairs=True)
        return K[..., :L]

    def step_ssm(self) -> tuple[Tensor, Tensor, Tensor]:
        """(Ā (H, N, N), B̄ (H, N), C (H, N)) of the recurrent mode, conjugate-complete.

        Recomputed when gradients are enabled; under ``torch.no_grad`` cached until a parameter
        changes (in place or by replacement).
        """
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in self.parameters())
        if not torch.is_grad_enabled() and self._step_cache is not None and self._step_cache[0] == key:
            return self._step_cache[1]
        dA, dB, C_tilde = self.dense_ssm()
        C = c_tilde_to_c(C_tilde[0], dA, self.l_max)
        mats = (dA, dB, C)
        self._step_cache = (key, mats) if not torch.is_grad_enabled() else None
        return mats

    # -- modes ----------------------------------------------------------------------------

    def default_state(self, batch_size: int, device=None, dtype=None) -> Tensor:
        """Zero state (batch, d_model, d_state), complex, conjugate-complete."""
        return self.zero_state(batch_size, self.d_state, device, dtype)

    def step(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """One step: x (batch, d_model) -> y (batch, d_model), new state; ``x_k = Ā x_{k-1} + B̄ u_k``."""
        self._check_step()
        check_step_input(self, x, state, (self.d_model, self.d_state))
        dA, dB, C = self.step_ssm()
        state = torch.einsum("hnm,bhm->bhn", dA, state) + dB * x.unsqueeze(-1)
        # the state is conjugate-symmetric, so C x is real up to rounding
        y = (C * state).sum(-1).real + self.D * x
        return y.to(x.dtype), state
