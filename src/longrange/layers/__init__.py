"""Sequence primitives: (batch, length, d_model) -> same shape."""
from longrange.layers.base import SSM_GROUP, SequencePrimitive, apply_mask, get_optim_hint, set_optim_hint

__all__ = ["SSM_GROUP", "SequencePrimitive", "apply_mask", "get_optim_hint", "set_optim_hint"]
