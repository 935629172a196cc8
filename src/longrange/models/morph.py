"""Turning causally pretrained Mamba models into bidirectional ones (thesis section 16.1.1).

F1:   one forward model, pretrained with next-token prediction; each block's conv + SSM branch is
      duplicated into the reverse branch of a bidirectional Mamba block.
F1R1: a forward model and a reverse model (pretrained on reversed sequences); the reverse
      branch of each block takes the reverse model's conv + SSM, everything else (encoder,
      projections, norms, head) comes from the forward model.
The result has exactly the structure of a freshly built bidirectional model, so its state_dict
loads into ``build_model(cfg.replace(direction="bidirectional"), ...)``.
"""

from __future__ import annotations

import copy

from longrange.blocks.mamba import MambaBlock
from longrange.errors import ConfigError
from longrange.models.model import SequenceModel


def _check_causal_mamba(model: SequenceModel, role: str) -> None:
    if model.cfg.block != "mamba" or model.cfg.layers or model.cfg.direction != "causal":
        raise ConfigError(
            f"the {role} model must be a causal Mamba model (one primitive in Mamba blocks) to morph, got "
            f"{model.cfg.name!r} direction={model.cfg.direction!r}"
        )


def _make_bidirectional(model: SequenceModel, reverse_branches) -> SequenceModel:
    new = copy.deepcopy(model)
    for block, reverse in zip(new.backbone.blocks, reverse_branches):
        assert isinstance(block, MambaBlock)
        block.branches.append(copy.deepcopy(reverse))
        block.direction = "bidirectional"
        block.bidirectional = True
    new.cfg = model.cfg.replace(direction="bidirectional")
    new.backbone.bidirectional = True
    return new


def morph_f1(model: SequenceModel) -> SequenceModel:
    """F1: a bidirectional copy of a causal Mamba model whose reverse branches duplicate the forward ones."""
    _check_causal_mamba(model, "forward")
    return _make_bidirectional(model, [block.branches[0] for block in model.backbone.blocks])


def morph_f1r1(forward: SequenceModel, reverse: SequenceModel) -> SequenceModel:
    """F1R1: forward model's weights, with the reverse model's conv + SSM in each reverse branch."""
    _check_causal_mamba(forward, "forward")
    _check_causal_mamba(reverse, "reverse")
    if forward.cfg.to_dict() != reverse.cfg.to_dict():
        diff = {
            k: (v, reverse.cfg.to_dict()[k]) for k, v in forward.cfg.to_dict().items() if reverse.cfg.to_dict()[k] != v
        }
        raise ConfigError(f"forward and reverse models differ in configuration: {diff}")
    return _make_bidirectional(forward, [block.branches[0] for block in reverse.backbone.blocks])
