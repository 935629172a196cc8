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
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from longrange.layers.hippo import legs_nplr
from longrange.layers.registry import register_primitive
from longrange.layers.ssm import (
    REAL_TRANSFORMS,
    ConvolutionalSSM,
    as_complex,
    check_choice,
    check_positive_int,
    check_state_size,
    check_step_input,
    decode_real_part,
    encode_real_part,
    real_param,
    sample_log_dt,
    skip_init,
    skip_parameter,
    ssm_parameter,
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

    Parameters per channel: 1 (log_dt) + N (Λ) + rN (P, 2rN untied) + N (B) + N (C̃, 2N if
    bidirectional) + 1 (D).
    """

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
    ):
        super().__init__()
        check_positive_int("d_model", d_model)
        check_state_size(d_state)
        check_positive_int("rank", rank)
        check_positive_int("l_max", l_max)
        check_choice("real_transform", real_transform, REAL_TRANSFORMS)
        self.d_model, self.d_state, self.rank, self.l_max = d_model, d_state, rank, l_max
        self.bidirectional, self.tie_pq, self.real_transform = bool(bidirectional), bool(tie_pq), real_transform
        H, M = d_model, d_state // 2

        Lambda, P, B, _ = legs_nplr(d_state, rank)
        channels = 2 if self.bidirectional else 1
        self.log_dt = ssm_parameter(sample_log_dt(H, dt_min, dt_max), ssm_lr_scale)
        self.Lambda_real = ssm_parameter(encode_real_part(Lambda.real.expand(H, M), real_transform), ssm_lr_scale)
        self.Lambda_imag = ssm_parameter(Lambda.imag.expand(H, M).clone(), ssm_lr_scale)
        self.P = ssm_parameter(real_param(P.unsqueeze(1).expand(rank, H, M)), ssm_lr_scale)
        if not self.tie_pq:
            self.Q = ssm_parameter(real_param(P.unsqueeze(1).expand(rank, H, M)), ssm_lr_scale)
        self.B = ssm_parameter(real_param(B.expand(H, M)), ssm_lr_scale)
        self.C_tilde = ssm_parameter(real_param(torch.randn(channels, H, M, dtype=torch.complex128)), ssm_lr_scale)
        self.D = skip_parameter(skip_init(H, d_init))
        self._step_cache: tuple | None = None

    # -- SSM pieces -----------------------------------------------------------------------

    def ssm(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(dt (H,), Λ (H, N/2), P (r, H, N/2), Q (r, H, N/2), B (H, N/2), C̃ (channels, H, N/2))."""
        Lambda = torch.complex(decode_real_part(self.Lambda_real, self.real_transform), self.Lambda_imag)
        P = as_complex(self.P)
        Q = P if self.tie_pq else as_complex(self.Q)
        return torch.exp(self.log_dt), Lambda, P, Q, as_complex(self.B), as_complex(self.C_tilde)

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
