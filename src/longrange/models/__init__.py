"""Models: the config dataclass, encoders, the backbone of blocks, heads, the builder, the
parameter report and state size, whole-model initialisation schemes (``models/init.py``), F1/F1R1
morphing, and the registries of primitives, blocks and heads.

    from longrange.models import ModelConfig, build_model
    model = build_model(ModelConfig(block="mamba", primitive="s6"), input_kind="numeric", d_input=3,
                        head="classify", n_out=10)
"""

from longrange.models.backbone import Backbone, make_block, make_mixer, make_primitive
from longrange.models.config import CHANNEL_MIXERS, Layer, ModelConfig
from longrange.models.encoders import NumericEncoder, TokenEncoder
from longrange.models.heads import PooledHead, RetrievalHead, TokenHead, pool
from longrange.models.model import SequenceModel, build_model, layer_report, make_head, parameter_report, state_size
from longrange.models.morph import morph_f1, morph_f1r1
from longrange.models.registry import (
    BLOCKS,
    HEADS,
    PRIMITIVES,
    block_names,
    head_names,
    primitive_names,
    register_block,
    register_head,
    register_primitive,
)

__all__ = [
    "BLOCKS",
    "CHANNEL_MIXERS",
    "HEADS",
    "Layer",
    "PRIMITIVES",
    "Backbone",
    "ModelConfig",
    "NumericEncoder",
    "PooledHead",
    "RetrievalHead",
    "SequenceModel",
    "TokenEncoder",
    "TokenHead",
    "block_names",
    "build_model",
    "head_names",
    "layer_report",
    "make_block",
    "make_head",
    "make_mixer",
    "make_primitive",
    "morph_f1",
    "morph_f1r1",
    "parameter_report",
    "pool",
    "primitive_names",
    "register_block",
    "register_head",
    "register_primitive",
    "state_size",
]
