"""Building primitives and blocks by name, and the backbone that stacks the blocks."""
from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from longrange.blocks.common import norm_step
from longrange.blocks.mamba import MambaBlock, RopeOptions, mamba_dt_rank
from longrange.blocks.norms import make_norm
from longrange.blocks.simple import SimpleBlock
from longrange.errors import ConfigError
from longrange.layers.base import SequencePrimitive
from longrange.models.config import ModelConfig


def make_primitive(name: str, d_model: int, *, d_state: int, bidirectional: bool, **options: Any) -> SequencePrimitive:
    """A sequence primitive by name: "s4", "s4d", "s6", "dlr" or "attention"."""
    try:
        if name == "s4d":
            from longrange.layers.s4d import S4D as cls
        elif name == "s4":
            from longrange.layers.s4 import S4 as cls
        elif name == "s6":
            from longrange.layers.s6 import S6 as cls
        elif name == "dlr":
            from longrange.layers.dlr import DLR as cls
        elif name == "attention":
            from longrange.layers.attention import Attention

            return Attention(d_model, bidirectional=bidirectional, **options)
        else:
            raise ConfigError(f"unknown primitive {name!r}; expected s4, s4d, s6, dlr or attention")
        return cls(d_model, d_state=d_state, bidirectional=bidirectional, **options)
    except TypeError as err:  # an unknown keyword in primitive_options
        raise ConfigError(f"bad options for primitive {name!r} {sorted(options)}: {err}") from err


def _rope_options(cfg: ModelConfig) -> RopeOptions | None:
    if not cfg.rope:
        return None
    return RopeOptions(base=cfg.rope_base, trainable=cfg.rope_trainable, normalize_len=cfg.rope_normalize_len, targets=cfg.rope_targets)


def make_block(cfg: ModelConfig) -> SequencePrimitive:
    """One block of the backbone described by ``cfg``."""
    norm, prenorm = cfg.resolved_norm, cfg.resolved_prenorm
    options = dict(cfg.primitive_options)
    if cfg.block == "transformer":
        from longrange.blocks.transformer import TransformerBlock

        return TransformerBlock(
            cfg.d_model,
            n_heads=cfg.n_heads,
            mlp_ratio=cfg.mlp_ratio,
            dropout=cfg.dropout,
            norm=norm,
            prenorm=prenorm,
            bidirectional=cfg.bidirectional,
            rope=cfg.rope,
            rope_base=cfg.rope_base,
            block_size=cfg.attn_block_size,
            window=cfg.attn_window,
        )
    if cfg.primitive == "attention":
        options.update(
            n_heads=cfg.n_heads, rope=cfg.rope, rope_base=cfg.rope_base, block_size=cfg.attn_block_size, window=cfg.attn_window
        )
    if cfg.block == "simple":
        if cfg.rope and cfg.primitive != "attention":
            raise ConfigError("model.rope before the SSM is defined for Mamba blocks (thesis section 14); use block='mamba'")
        mixer = make_primitive(cfg.primitive, cfg.d_model, d_state=cfg.d_state, bidirectional=cfg.bidirectional, **options)
        return SimpleBlock(mixer, dropout=cfg.dropout, norm=norm, prenorm=prenorm)
    # Mamba block: causal primitives in each branch; the block provides the direction.
    if cfg.primitive == "s6":
        options.setdefault("dt_rank", mamba_dt_rank(cfg.d_model))
        if cfg.rope:
            options.setdefault("rope_targets", cfg.rope_targets)
    rope = None
    if cfg.primitive != "attention":
        rope = _rope_options(cfg)

    def make_ssm(d_inner: int) -> SequencePrimitive:
        return make_primitive(cfg.primitive, d_inner, d_state=cfg.d_state, bidirectional=False, **options)

    return MambaBlock(
        cfg.d_model,
        make_ssm,
        expand=cfg.expand,
        d_conv=cfg.d_conv,
        dropout=cfg.dropout,
        norm=norm,
        prenorm=prenorm,
        direction=cfg.direction,
        rope=rope,
    )


class Backbone(nn.Module):
    """``n_layers`` blocks, with a final norm when the blocks are pre-norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.d_model = cfg.d_model
        self.bidirectional = cfg.bidirectional
        self.blocks = nn.ModuleList(make_block(cfg) for _ in range(cfg.n_layers))
        self.final_norm = make_norm(cfg.resolved_norm if cfg.resolved_prenorm else "none", cfg.d_model)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        for block in self.blocks:
            x = block(x, mask)
        return self.final_norm(x, mask)

    def default_state(self, batch_size: int, device=None, dtype=None) -> list[Any]:
        return [block.default_state(batch_size, device=device, dtype=dtype) for block in self.blocks]

    def step(self, x: Tensor, state: list[Any]) -> tuple[Tensor, list[Any]]:
        new_state = []
        for block, s in zip(self.blocks, state):
            x, s = block.step(x, s)
            new_state.append(s)
        return norm_step(self.final_norm, x), new_state

    def mixers(self) -> list[SequencePrimitive]:
        """The sequence primitives inside the blocks (for parameter reports and kernel analysis)."""
        return [m for block in self.blocks for m in block.mixers]
