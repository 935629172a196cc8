"""Flip-and-sum bidirectionality for primitives without a two-sided kernel (S6, DLR, ...)."""

from __future__ import annotations

from torch import Tensor

from longrange.layers.base import SequencePrimitive, apply_mask


class FlipSum(SequencePrimitive):
    """``y = forward(x) + flip(backward(flip(x)))`` with independent parameters in each direction.

    The input is zeroed at padded positions first. Padding sits at the end of each sequence, so
    after the flip it comes first: the backward primitive reads zeros there and, being linear in
    its input from a zero state, reaches the first real position in the same state as without
    padding. Outputs at real positions therefore do not depend on the amount of padding.
    """

    bidirectional = True

    def __init__(self, forward_layer: SequencePrimitive, backward_layer: SequencePrimitive):
        super().__init__()
        if forward_layer.bidirectional or backward_layer.bidirectional:
            raise ValueError("FlipSum combines two causal primitives")
        if forward_layer.d_model != backward_layer.d_model:
            raise ValueError(f"FlipSum directions differ in width: {forward_layer.d_model} vs {backward_layer.d_model}")
        self.d_model = forward_layer.d_model
        self.fwd = forward_layer
        self.bwd = backward_layer

    def forward(self, x: Tensor, mask: Tensor | None = None, **kwargs) -> Tensor:
        x = apply_mask(x, mask)
        flipped_mask = None if mask is None else mask.flip(1)
        flipped_kwargs = {k: (v.flip(1) if isinstance(v, Tensor) else v) for k, v in kwargs.items()}
        return self.fwd(x, mask, **kwargs) + self.bwd(x.flip(1), flipped_mask, **flipped_kwargs).flip(1)
