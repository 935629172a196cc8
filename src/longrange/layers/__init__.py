"""Sequence primitives: (batch, length, d_model) -> same shape."""

from longrange.layers.attention import Attention
from longrange.layers.base import (
    NO_DECAY_GROUP,
    SSM_GROUP,
    SequencePrimitive,
    apply_mask,
    get_optim_hint,
    set_optim_hint,
)
from longrange.layers.base_conv import BaseConv
from longrange.layers.bidirectional import FlipSum
from longrange.layers.deltanet import DeltaNet, GatedDeltaNet
from longrange.layers.dlr import DLR
from longrange.layers.gla import GLA
from longrange.layers.h3 import H3
from longrange.layers.hyena import Hyena
from longrange.layers.linear_attention import LinearAttention
from longrange.layers.lru import LRU
from longrange.layers.mamba2 import Mamba2
from longrange.layers.mamba3 import Mamba3
from longrange.layers.registry import PRIMITIVES, register_primitive
from longrange.layers.rope import RotaryEmbedding
from longrange.layers.rwkv import RWKV
from longrange.layers.s4 import S4
from longrange.layers.s4d import S4D
from longrange.layers.s6 import S6

__all__ = [
    "Attention",
    "BaseConv",
    "DLR",
    "DeltaNet",
    "FlipSum",
    "GLA",
    "GatedDeltaNet",
    "H3",
    "Hyena",
    "LRU",
    "LinearAttention",
    "Mamba2",
    "Mamba3",
    "NO_DECAY_GROUP",
    "PRIMITIVES",
    "RWKV",
    "RotaryEmbedding",
    "S4",
    "S4D",
    "S6",
    "SSM_GROUP",
    "SequencePrimitive",
    "apply_mask",
    "get_optim_hint",
    "register_primitive",
    "set_optim_hint",
]
