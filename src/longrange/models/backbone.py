"""Building primitives and blocks by name, and the backbone that stacks the blocks.

Blocks are built by the function registered under ``model.block`` (:data:`BLOCKS`), which
receives the model config; the configured primitive inside a block comes from :func:`make_mixer`.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from longrange.blocks.common import norm_step
from longrange.blocks.mamba import MambaBlock, RopeOptions, mamba_dt_rank
from longrange.blocks.norms import make_norm
from longrange.blocks.residual import ChannelMixerBlock, ResidualBlock
from longrange.blocks.simple import SimpleBlock
from longrange.blocks.transformer import TransformerBlock
from longrange.errors import ConfigError
from longrange.layers.base import SequencePrimitive
from longrange.models.config import Layer, ModelConfig
from longrange.models.registry import BLOCKS, PRIMITIVES, builds_model, register_block

#: Model fields behind the settings the builder passes to primitives (for messages).
_SETTING_FIELDS = {
    "bidirectional": "direction",
    "block_size": "attn_block_size",
    "window": "attn_window",
    "bias": "attn_bias",
    "dropout": "attn_dropout",
}


def make_primitive(
    name: str, d_model: int, *, d_state: int | None = None, bidirectional: bool = False, **options: Any
) -> SequencePrimitive:
    """The primitive registered as ``name`` (:data:`PRIMITIVES`): ``cls(d_model, **options)``.

    ``d_state`` and ``bidirectional`` go to the constructors that name them (attention has no
    state size); ``bidirectional=True`` needs a constructor that takes it. Options are checked
    against the constructor's signature before it is called (unknown option -> ConfigError).
    """
    given = {"bidirectional": bool(bidirectional), **({} if d_state is None else {"d_state": d_state})}
    return build_primitive(name, d_model, options, given=given)


def build_primitive(
    name: str,
    d_model: int,
    options: dict[str, Any],
    *,
    given: dict[str, Any],
    defaults: dict[str, Any] | None = None,
    where: str = "options",
) -> SequencePrimitive:
    """:func:`make_primitive` with the settings spelled out.

    ``given`` are the model's own settings (``bidirectional``, ``d_state``, ``n_heads``, ...): they go
    to the constructors that name them, and an option that sets one of them again is an error.
    ``defaults`` also go to the constructors that name them, unless an option sets them.
    ``where`` names the options in messages (e.g. "model.primitive_options").
    """
    if given.get("bidirectional") and not PRIMITIVES.accepts(name, "bidirectional", 1):
        raise ConfigError(
            f"primitive {name!r} has no bidirectional mode (its constructor takes no 'bidirectional'); "
            "use model.direction = 'causal', or a Mamba block, whose bidirectional direction runs causal primitives"
        )
    for key in sorted(options):
        if key in given and PRIMITIVES.accepts(name, key, 1):
            raise ConfigError(
                f"{where}: {key!r} of primitive {name!r} is set by model.{_SETTING_FIELDS.get(key, key)}; set it there"
            )
    return PRIMITIVES.build_from(name, (d_model,), options, offered={**(defaults or {}), **given}, where=where)


def make_mixer(
    cfg: ModelConfig, d_model: int | None = None, *, bidirectional: bool | None = None, **defaults: Any
) -> SequencePrimitive:
    """The configured primitive (``cfg.primitive`` with ``cfg.primitive_options``) for a block.

    ``d_model`` defaults to ``cfg.d_model`` and ``bidirectional`` to ``cfg.bidirectional``; the
    model's state size and attention settings go to the primitives that take them, and
    ``defaults`` (e.g. ``dt_rank``) to those that take them unless ``cfg.primitive_options`` sets them.
    """
    given = {
        "bidirectional": cfg.bidirectional if bidirectional is None else bool(bidirectional),
        "d_state": cfg.d_state,
        "n_heads": cfg.n_heads,
        "rope": cfg.rope,
        "rope_base": cfg.rope_base,
        "block_size": cfg.attn_block_size,
        "window": cfg.attn_window,
        "attn_dim": cfg.attn_dim,
    }
    # "bias" and "dropout" are too common names to offer to every primitive: model.attn_bias and
    # model.attn_dropout go to attention-like primitives only (those that take attn_dim).
    if PRIMITIVES.accepts(cfg.primitive, "attn_dim", 1):
        given["bias"] = cfg.attn_bias
        given["dropout"] = cfg.attn_dropout
    return build_primitive(
        cfg.primitive,
        cfg.d_model if d_model is None else d_model,
        dict(cfg.primitive_options),
        given=given,
        defaults=defaults,
        where="model.primitive_options",
    )


def rotates_itself(primitive: str) -> bool:
    """Whether a primitive applies rotary positions itself (its constructor takes ``rope``)."""
    return PRIMITIVES.accepts(primitive, "rope", 1)


def make_block(cfg: ModelConfig) -> SequencePrimitive:
    """One block of the backbone described by ``cfg``: the builder registered as ``cfg.block``."""
    build = BLOCKS.get(cfg.block)
    if builds_model(build):
        raise ConfigError(f"model.block {cfg.block!r} is a whole model: build it with build_model, not as a block")
    return build(cfg)


def make_layer(layer: Layer) -> SequencePrimitive:
    """One layer of a model's stack (:meth:`ModelConfig.stack`): its primitive in its block, or a
    channel mixer of its own."""
    if layer.is_channel_mixer:
        cfg = layer.cfg
        options = {
            **_residual_options(cfg),
            **{k: v for k, v in layer.own.items() if k in ("norm", "prenorm") and v is not None},
        }
        return ChannelMixerBlock(
            cfg.d_model,
            mlp=layer.mlp,
            mlp_ratio=layer.own.get("mlp_ratio", cfg.mlp_ratio),
            bidirectional=cfg.bidirectional,
            **options,
        )
    try:
        return make_block(layer.cfg)
    except ConfigError as err:
        if not layer.stacked:
            raise
        message = str(err).replace("model.primitive_options", f"model.layers[{layer.entry}].options")
        raise ConfigError(f"model.layers[{layer.entry}] ({layer.name}): {message}") from None


def _residual_options(cfg: ModelConfig) -> dict[str, Any]:
    """What every built-in block takes from the config for its residual branches."""
    return {"dropout": cfg.dropout, "norm": cfg.resolved_norm, "prenorm": cfg.resolved_prenorm}


@register_block("transformer")
def transformer_block(cfg: ModelConfig) -> SequencePrimitive:
    """Attention and an MLP (the block holds its own attention; ``model.primitive`` is "attention")."""
    return TransformerBlock(
        cfg.d_model,
        n_heads=cfg.n_heads,
        mlp_ratio=cfg.mlp_ratio,
        bidirectional=cfg.bidirectional,
        rope=cfg.rope,
        rope_base=cfg.rope_base,
        block_size=cfg.attn_block_size,
        window=cfg.attn_window,
        attn_dim=cfg.attn_dim,
        attn_bias=cfg.attn_bias,
        attn_dropout=cfg.attn_dropout,
        **_residual_options(cfg),
    )


@register_block("simple")
def simple_block(cfg: ModelConfig) -> SequencePrimitive:
    """The S4 block around the configured primitive."""
    if cfg.rope and not rotates_itself(cfg.primitive):
        raise ConfigError(
            "model.rope before the SSM is defined for Mamba blocks (thesis section 14); use block='mamba'"
        )
    return SimpleBlock(make_mixer(cfg), output_glu=cfg.output_glu, **_residual_options(cfg))


@register_block("residual")
def residual_block(cfg: ModelConfig) -> SequencePrimitive:
    """A whole mixer layer (Mamba-2, GLA, DeltaNet, ...) and the MLP ``model.mlp`` in residual branches."""
    if cfg.rope and not rotates_itself(cfg.primitive):
        raise ConfigError(
            f"model.rope: primitive {cfg.primitive!r} has no rotary positions of its own; "
            "rotary positions before the SSM are defined for Mamba blocks"
        )
    return ResidualBlock(make_mixer(cfg), mlp=cfg.mlp, mlp_ratio=cfg.mlp_ratio, **_residual_options(cfg))


def _rope_options(cfg: ModelConfig) -> RopeOptions | None:
    if not cfg.rope or rotates_itself(cfg.primitive):
        return None
    return RopeOptions(
        base=cfg.rope_base, trainable=cfg.rope_trainable, normalize_len=cfg.rope_normalize_len, targets=cfg.rope_targets
    )


@register_block("mamba")
def mamba_block(cfg: ModelConfig) -> SequencePrimitive:
    """The Mamba block with causal primitives in each branch; the block provides the direction."""
    defaults: dict[str, Any] = {"dt_rank": mamba_dt_rank(cfg.d_model)}
    if cfg.rope:
        defaults["rope_targets"] = cfg.rope_targets

    def make_ssm(d_inner: int) -> SequencePrimitive:
        return make_mixer(cfg, d_inner, bidirectional=False, **defaults)

    return MambaBlock(
        cfg.d_model,
        make_ssm,
        expand=cfg.expand,
        d_conv=cfg.d_conv,
        direction=cfg.direction,
        rope=_rope_options(cfg),
        **_residual_options(cfg),
    )


class Backbone(nn.Module):
    """``n_layers`` blocks (the layers of ``cfg.stack()``), with a final norm when the blocks are pre-norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.d_model = cfg.d_model
        self.bidirectional = cfg.bidirectional
        layers = cfg.stack()
        #: Each block's name in the stack ("s6" for a model of one primitive; "mamba2", "swiglu", ...).
        self.layer_names = [layer.name for layer in layers]
        self.blocks = nn.ModuleList(make_layer(layer) for layer in layers)
        # A primitive whose initialisation depends on its depth (RWKV) learns its place among the
        # sequence-mixing layers (a channel mixer of its own, "swiglu", is part of the layer before it).
        mixing = [block for layer, block in zip(layers, self.blocks) if not layer.is_channel_mixer]
        for index, block in enumerate(mixing):
            for mixer in getattr(block, "mixers", ()):
                place = getattr(mixer, "place_in_stack", None)
                if place is not None:
                    place(index, len(mixing))
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
