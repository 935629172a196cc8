"""The registry of sequence primitives (``model.primitive``): name -> :class:`SequencePrimitive` class.

Register a primitive with the decorator in the module that defines it::

    @register_primitive("s4d")
    class S4D(ConvolutionalSSM):
        def __init__(self, d_model: int, d_state: int = 64, ..., bidirectional: bool = False): ...

Constructor convention: the width ``d_model`` comes first (positionally); the remaining
parameters are options, set by ``model.primitive_options``. The model builder also passes, to
the constructors that name them, the model's own settings: ``d_state``, ``bidirectional``,
``n_heads``, ``rope``, ``rope_base``, ``block_size`` (``model.attn_block_size``), ``window``
(``model.attn_window``), ``attn_dim``, ``bias`` and ``dropout`` (``model.attn_bias``,
``model.attn_dropout``; only to constructors that also name ``attn_dim``), and inside a Mamba
block ``dt_rank`` (Mamba's default) and, with ``model.rope``, ``rope_targets``. A primitive that
names ``rope`` applies rotary positions itself; for others the Mamba block rotates their input.
"""

from __future__ import annotations

from longrange.registry import Registry

#: The sequence primitives by name (the built-ins are registered by importing :mod:`longrange.layers`).
PRIMITIVES: Registry = Registry("primitive", modules=("longrange.layers",))

#: Decorator: ``@register_primitive("name")`` on a SequencePrimitive subclass.
register_primitive = PRIMITIVES.register
