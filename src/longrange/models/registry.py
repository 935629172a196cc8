"""The model's extension points by name: primitives, blocks and heads.

These registries are the source of truth for ``model.primitive``, ``model.block`` and the head
kinds: a registry is read like a collection of its names (``"s4d" in PRIMITIVES``,
``", ".join(BLOCKS)``), so a name registered by a user's module is valid wherever the built-in
names are.

- :data:`PRIMITIVES` (``@register_primitive``): sequence primitive classes, see
  :mod:`longrange.layers.registry` for the constructor convention.
- :data:`BLOCKS` (``@register_block``): functions ``build(cfg: ModelConfig) -> SequencePrimitive``
  making one block of the backbone; the built-ins are in :mod:`longrange.models.backbone`, whose
  :func:`~longrange.models.backbone.make_mixer` builds the configured primitive inside a block.
  A block name may instead stand for a whole model (``@register_model``; ``hf``, a Hugging Face
  LM): its function builds the model, see :func:`longrange.models.model.build_model`.
- :data:`HEADS` (``@register_head``): head classes, see :mod:`longrange.models.heads`.
"""

from __future__ import annotations

from longrange.layers.registry import PRIMITIVES, register_primitive
from longrange.registry import Registry

# The built-in blocks and heads are registered by the modules named here, imported at the first
# lookup: this module imports no other module of the models package (models.config imports it).

#: Block builders by name ("simple", "mamba", "transformer").
BLOCKS: Registry = Registry("block", modules=("longrange.models.backbone", "longrange.models.hf"))

#: Decorator: ``@register_block("name")`` on a function ``build(cfg) -> SequencePrimitive``.
register_block = BLOCKS.register


def register_model(name: str):
    """Decorator: ``model.block: name`` stands for a whole model, built by the decorated function
    ``build(cfg, *, input_kind, head, n_out, vocab_size, d_input, mask_channel, vocab, hf_resolved)``
    instead of a backbone of blocks."""

    def add(build):
        build.builds_model = True
        return register_block(name)(build)

    return add


def builds_model(entry: object) -> bool:
    """Whether a :data:`BLOCKS` entry builds a whole model (:func:`register_model`), not a block."""
    return bool(getattr(entry, "builds_model", False))


#: Output heads by kind ("classify", "regress", "retrieval", "tokens").
HEADS: Registry = Registry("head", modules=("longrange.models.heads",))

#: Decorator: ``@register_head("kind")`` on a head class.
register_head = HEADS.register


def primitive_names() -> list[str]:
    """The names ``model.primitive`` may take."""
    return PRIMITIVES.names()


def block_names() -> list[str]:
    """The names ``model.block`` may take."""
    return BLOCKS.names()


def head_names() -> list[str]:
    """The head kinds ``build_model(head=...)`` may take."""
    return HEADS.names()


__all__ = [
    "BLOCKS",
    "HEADS",
    "PRIMITIVES",
    "block_names",
    "builds_model",
    "head_names",
    "primitive_names",
    "register_block",
    "register_head",
    "register_model",
    "register_primitive",
]
