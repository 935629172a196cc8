"""Blocks: a sequence primitive inside residual branches, norms and projections.

- :class:`SimpleBlock`: the S4 block (primitive -> GELU -> dropout -> Linear + GLU).
- :class:`MambaBlock`: the Mamba block with any primitive in the SSM slot; causal, bidirectional
  and placebo directions, optional RoPE before the SSM (:class:`RopeOptions`).
- :class:`TransformerBlock`: attention and an MLP.
- :class:`ResidualBlock`: a whole mixer layer (Mamba-2, GLA, DeltaNet, ...) and an optional MLP.

Blocks are built from a model config by the builders registered in :data:`longrange.models.BLOCKS`.
"""

from longrange.blocks.common import FeatureDropout, norm_step
from longrange.blocks.mamba import ConvSSMBranch, MambaBlock, RopeOptions, mamba_dt_rank
from longrange.blocks.norms import NORMS, RMSNorm, SequenceBatchNorm, make_norm
from longrange.blocks.residual import MLPS, ResidualBlock, SwiGLU
from longrange.blocks.simple import SimpleBlock
from longrange.blocks.transformer import TransformerBlock

__all__ = [
    "MLPS",
    "NORMS",
    "ConvSSMBranch",
    "FeatureDropout",
    "MambaBlock",
    "RMSNorm",
    "ResidualBlock",
    "RopeOptions",
    "SequenceBatchNorm",
    "SimpleBlock",
    "SwiGLU",
    "TransformerBlock",
    "make_norm",
    "mamba_dt_rank",
    "norm_step",
]
