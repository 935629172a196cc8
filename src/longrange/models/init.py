"""Whole-model initialisation schemes (``model.init``), for presets that reproduce a source's model.

By default every layer keeps its own initialisation (PyTorch's for its linear maps, the layer's
for its recurrence), so every model of a comparison is initialised alike. A published experiment
whose code re-initialises the whole model after building it is reproduced with a scheme:

* ``gpt2``: GPT-2's rule, as Zoology's ``TransformerBlock`` models (``zoology/model.py``
  ``_init_weights``), mad-lab's autoencoder and H3's language models apply it: every linear map's
  weight and every embedding N(0, ``init_std``), every linear bias 0; the parameters named in
  ``init_rescaled`` (the source's residual output projections, ``out_proj`` and ``fc2`` there)
  N(0, ``init_std`` / sqrt(2 ``n_layers``)).
* ``mamba``: the rule of ``mamba_ssm``, Zoology's Mamba blocks and mad-lab's language model:
  embeddings N(0, ``init_std``), linear biases 0, linear weights the layers' own; the parameters
  of ``init_rescaled`` PyTorch's linear initialisation divided by sqrt(``n_layers``) (one
  residual branch a layer).

The output head is one more linear map to both (a replaced head is drawn alike). A parameter its
layer marks ``_no_reinit`` (S6's time-step bias, whose initialisation sets the time scales) keeps
its layer's value, as the sources mark it. Norms, convolutions and a layer's own parameters
(decays, filters, skips) are untouched: the sources re-initialise ``nn.Linear`` and
``nn.Embedding`` modules only.
"""

from __future__ import annotations

import math
from fnmatch import fnmatchcase
from typing import Any

import torch
from torch import nn

from longrange.errors import ConfigError

#: Residual branches a layer counts in each scheme's rescaling of ``init_rescaled``.
RESIDUALS_PER_LAYER = {"gpt2": 2, "mamba": 1}


def _kept(param: nn.Parameter | None) -> bool:
    return param is None or bool(getattr(param, "_no_reinit", False))


def _draw(modules, scheme: str, std: float) -> None:
    for module in modules:
        if isinstance(module, nn.Linear):
            if scheme == "gpt2" and not _kept(module.weight):
                module.weight.normal_(0.0, std)
            if not _kept(module.bias):
                module.bias.zero_()
        elif isinstance(module, nn.Embedding) and not _kept(module.weight):
            module.weight.normal_(0.0, std)


@torch.no_grad()
def init_head(head: nn.Module, scheme: str, std: float) -> None:
    """Draw a new output head by ``scheme`` (``model.init``), as :func:`initialise` draws the model's."""
    if scheme != "default":
        _draw(head.modules(), scheme, std)


@torch.no_grad()
def initialise(model: nn.Module, cfg: Any) -> None:
    """Apply ``cfg.init`` (a :class:`~longrange.models.config.ModelConfig`) to ``model``. A pattern of
    ``cfg.init_rescaled`` that names no parameter of the model is a ConfigError naming it."""
    scheme = cfg.init
    if scheme == "default":
        return
    _draw(model.modules(), scheme, cfg.init_std)
    named = dict(model.named_parameters())
    divisor = math.sqrt(RESIDUALS_PER_LAYER[scheme] * cfg.n_layers)
    for pattern in cfg.init_rescaled:
        matched = [name for name in named if fnmatchcase(name, pattern)]
        if not matched:
            raise ConfigError(
                f"model.init_rescaled: {pattern!r} names no parameter of the model; its names are like "
                + ", ".join(repr(name) for name in list(named)[:4])
            )
        for name in matched:
            param = named[name]
            if scheme == "gpt2":
                param.normal_(0.0, cfg.init_std / divisor)
            else:
                nn.init.kaiming_uniform_(param, a=math.sqrt(5))  # PyTorch's initialisation of a linear weight
                param.div_(divisor)
