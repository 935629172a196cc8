"""The Mamba block with any primitive in the SSM slot, and its bidirectional and placebo variants.

    x -> norm -> in_proj (d -> 2·E·d) -> (u, z)
    u -> causal depthwise conv (width 4) -> SiLU -> [RoPE] -> SSM   (one branch, or two: see below)
    y = branch output · SiLU(z) -> out_proj (E·d -> d) -> dropout;   out = x + y

With one branch and an SSM that takes the gate (S6: ``fuses_gate``), the gate is applied inside
the SSM's scan kernel (its ``z``), the same computation in fewer passes over memory.

Directions (thesis section 15.2):
  "causal":        one branch.
  "bidirectional": two branches with independent conv + SSM; the second runs on the flipped
                   sequence and its output is flipped back; the branch outputs are summed.
  "placebo":       the same two branches and parameters, without the flips (still causal).

RoPE (thesis section 14.3): the rotation is applied to the branch input right before the SSM.
For S6 the rotated input can be routed to any of B, C, Δ and the scanned input x
(``rope_targets``); other primitives see the rotated input.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longrange.blocks.common import FeatureDropout, norm_step
from longrange.blocks.norms import make_norm
from longrange.errors import ConfigError
from longrange.layers.base import SequencePrimitive, apply_mask
from longrange.ops.conv import causal_conv1d, causal_conv1d_update

DIRECTIONS = ("causal", "bidirectional", "placebo")


@dataclass
class RopeOptions:
    """The thesis' RoPE options for SSM blocks (section 14.3.2)."""

    base: float = 10000.0
    trainable: bool = False
    #: Scale rotations so that the largest relative rotation over this many positions is π.
    normalize_len: int | None = None
    #: For S6: which of "B", "C", "delta", "x" are computed from the rotated input.
    targets: tuple[str, ...] = ("x",)


class ConvSSMBranch(nn.Module):
    """Causal depthwise conv -> SiLU -> [RoPE] -> SSM, on (batch, length, d_inner)."""

    def __init__(self, d_inner: int, d_conv: int, ssm: SequencePrimitive, rope: RopeOptions | None):
        super().__init__()
        if ssm.d_model != d_inner:
            raise ConfigError(f"SSM width {ssm.d_model} does not match the block's inner width {d_inner}")
        if ssm.bidirectional:
            raise ConfigError("the SSM inside a Mamba block must be causal; use direction='bidirectional' on the block")
        self.d_conv = d_conv
        self.conv1d = nn.Conv1d(d_inner, d_inner, d_conv, groups=d_inner, bias=True)
        self.ssm = ssm
        self.rope = None
        self.rope_to_ssm = False  # whether the SSM takes the rotated input as a separate argument (S6)
        if rope is not None:
            from longrange.layers.rope import RotaryEmbedding

            self.rope = RotaryEmbedding(
                d_inner, base=rope.base, trainable=rope.trainable, normalize_len=rope.normalize_len
            )
            self.rope_to_ssm = hasattr(ssm, "rope_targets")
            if not self.rope_to_ssm and tuple(rope.targets) != ("x",):
                raise ConfigError(
                    f"rope targets {tuple(rope.targets)} need an S6 primitive; {type(ssm).__name__} only takes a rotated input ('x')"
                )

    def forward(self, u: Tensor, mask: Tensor | None, gate: Tensor | None = None) -> Tensor:
        """``gate``: passed to an SSM that applies the block's SiLU gate itself (``fuses_gate``)."""
        u = apply_mask(u, mask)
        u = causal_conv1d(u.transpose(1, 2), self.conv1d.weight.squeeze(1), self.conv1d.bias, activation="silu")
        u = u.transpose(1, 2)
        extra = {} if gate is None else {"gate": gate}
        if self.rope is None:
            return self.ssm(u, mask, **extra)
        rotated = self.rope(u)
        if self.rope_to_ssm:
            return self.ssm(u, mask, x_rot=rotated, **extra)
        return self.ssm(rotated, mask, **extra)

    def default_state(self, batch_size: int, device=None, dtype=None) -> dict[str, Any]:
        w = self.conv1d.weight
        conv = torch.zeros(batch_size, w.shape[0], self.d_conv - 1, device=device or w.device, dtype=dtype or w.dtype)
        return {"conv": conv, "ssm": self.ssm.default_state(batch_size, device=device, dtype=dtype), "pos": 0}

    def step(self, u_t: Tensor, state: dict[str, Any]) -> tuple[Tensor, dict[str, Any]]:
        v, conv_state = causal_conv1d_update(
            u_t, state["conv"], self.conv1d.weight.squeeze(1), self.conv1d.bias, activation="silu"
        )
        pos = state["pos"]
        if self.rope is None:
            y, ssm_state = self.ssm.step(v, state["ssm"])
        elif self.rope_to_ssm:
            y, ssm_state = self.ssm.step(v, state["ssm"], x_rot_t=self.rope.rotate_at(v, pos))
        else:
            y, ssm_state = self.ssm.step(self.rope.rotate_at(v, pos), state["ssm"])
        return y, {"conv": conv_state, "ssm": ssm_state, "pos": pos + 1}


class MambaBlock(SequencePrimitive):
    def __init__(
        self,
        d_model: int,
        make_ssm: Callable[[int], SequencePrimitive],
        expand: int = 2,
        d_conv: int = 4,
        dropout: float = 0.0,
        norm: str = "rms",
        prenorm: bool = True,
        direction: str = "causal",
        rope: RopeOptions | None = None,
    ):
        """``make_ssm(d_inner)`` builds a causal primitive of width d_inner = expand·d_model; it is
        called once per branch so that the branches have independent parameters."""
        super().__init__()
        if direction not in DIRECTIONS:
            raise ConfigError(f"unknown direction {direction!r}; expected one of {', '.join(DIRECTIONS)}")
        self.d_model = d_model
        self.direction = direction
        self.bidirectional = direction == "bidirectional"
        self.prenorm = prenorm
        d_inner = expand * d_model
        self.d_inner = d_inner
        self.norm = make_norm(norm, d_model)
        self.in_proj = nn.Linear(d_model, 2 * d_inner, bias=False)
        n_branches = 1 if direction == "causal" else 2
        self.branches = nn.ModuleList(
            ConvSSMBranch(d_inner, d_conv, make_ssm(d_inner), rope) for _ in range(n_branches)
        )
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)
        self.dropout = FeatureDropout(dropout)
        self._fuse_gate = True

    @property
    def fused_gate(self) -> bool:
        """Whether the SiLU gate is applied inside the SSM (S6's scan kernel): a causal block with one
        branch whose SSM takes it. Read at every call, so a block made bidirectional afterwards (F1,
        ``models/morph.py``) gates outside; setting it False keeps the gate outside (tests)."""
        return (
            self._fuse_gate
            and self.direction == "causal"
            and len(self.branches) == 1
            and getattr(self.branches[0].ssm, "fuses_gate", False)
        )

    @fused_gate.setter
    def fused_gate(self, value: bool) -> None:
        self._fuse_gate = bool(value)

    @property
    def mixers(self) -> list[SequencePrimitive]:
        return [branch.ssm for branch in self.branches]

    def _mix(self, u: Tensor, mask: Tensor | None) -> Tensor:
        y = self.branches[0](u, mask)
        if self.direction == "bidirectional":
            flipped_mask = None if mask is None else mask.flip(1)
            # Padding sits at the end; zeroed, it is a run of zeros before the flipped sequence.
            y = y + self.branches[1](apply_mask(u, mask).flip(1), flipped_mask).flip(1)
        elif self.direction == "placebo":
            y = y + self.branches[1](u, mask)
        return y

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        self._check_input(x)
        h = self.norm(x, mask) if self.prenorm else x
        u, z = self.in_proj(h).chunk(2, dim=-1)
        gated = self.branches[0](u, mask, gate=z) if self.fused_gate else self._mix(u, mask) * F.silu(z)
        out = x + self.dropout(self.out_proj(gated))
        return out if self.prenorm else self.norm(out, mask)

    def default_state(self, batch_size: int, device=None, dtype=None) -> list[dict[str, Any]]:
        self._check_step()
        return [b.default_state(batch_size, device=device, dtype=dtype) for b in self.branches]

    def step(self, x: Tensor, state: list[dict[str, Any]]) -> tuple[Tensor, list[dict[str, Any]]]:
        self._check_step()
        h = norm_step(self.norm, x) if self.prenorm else x
        u, z = self.in_proj(h).chunk(2, dim=-1)
        y = 0
        new_state = []
        for branch, branch_state in zip(self.branches, state):
            y_b, s = branch.step(u, branch_state)
            y = y + y_b
            new_state.append(s)
        out = x + self.dropout(self.out_proj(y * F.silu(z)))
        return (out if self.prenorm else norm_step(self.norm, out)), new_state


def mamba_dt_rank(d_model: int) -> int:
    """Mamba's default Δ projection rank: ceil(d_model / 16) of the block width (before expansion)."""
    return math.ceil(d_model / 16)
