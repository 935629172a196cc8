"""The model configuration: a plain dataclass, saved with every run and overridable by dotted name."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from longrange import typed
from longrange.errors import ConfigError
from longrange.identity import declare_defaults
from longrange.models.registry import BLOCKS, PRIMITIVES  # the registries are the source of truth
from longrange.registry import PLUGIN_HINT

DIRECTIONS = ("causal", "bidirectional", "placebo")
POOLINGS = ("mean", "last", "cls", "max")
HEAD_ACTIVATIONS = ("gelu", "relu")
HEAD_LAYERS = (1, 2, 3)
HF_KEYS = ("model", "pretrained", "config", "revision")
POSITIONAL = ("none", "learned", "sinusoidal")
MLPS = ("swiglu", "gelu", "none")  # blocks/residual.py

#: Norm placement and kind when the config leaves them unset (the papers' defaults).
_BLOCK_DEFAULTS = {
    "simple": {"norm": "layer", "prenorm": False},
    "mamba": {"norm": "rms", "prenorm": True},
    "transformer": {"norm": "layer", "prenorm": True},
    "residual": {"norm": "rms", "prenorm": True},
    "hf": {"norm": "none", "prenorm": False},  # the LM's own
}
#: A user's registered block with norm/prenorm unset.
_OTHER_BLOCK = {"norm": "layer", "prenorm": True}


@dataclass
class ModelConfig:
    """A sequence model: encoder -> ``n_layers`` blocks -> head.

    ``block`` is the block type and ``primitive`` the sequence primitive inside it (the Transformer
    block always holds attention); ``block="hf"`` wraps the Hugging Face causal LM that ``hf``
    names instead (``longrange.models.hf``), whose own configuration gives width and depth.
    ``direction`` is "causal", "bidirectional" or, for Mamba blocks,
    "placebo" (the bidirectional block's parameters without the flips).
    """

    block: str = "mamba"
    primitive: str = "s6"
    n_layers: int = 6
    d_model: int = 116
    d_state: int = 16
    direction: str = "causal"
    dropout: float = 0.0
    norm: str | None = None
    prenorm: bool | None = None
    #: Simple block: the output Linear(d, 2d) + GLU of the later S4 code (True), or the original
    #: S4 layer's Linear(d, d) without a GLU (False; the S4 code at tag v1).
    output_glu: bool = True
    # Mamba block
    expand: int = 2
    d_conv: int = 4
    # Attention / Transformer block
    n_heads: int = 8
    mlp_ratio: float = 4.0
    #: Residual block: the MLP after the mixer, "swiglu", "gelu" or "none" (blocks/residual.py).
    mlp: str = "swiglu"
    attn_block_size: int | None = None
    #: Sliding-window attention: windows of this many positions, each attending to itself and one
    #: window back and forward (causal: itself up to the query and one window back). None = dense.
    attn_window: int | None = None
    #: Width of the attention's queries, keys and values (d_model -> attn_dim; the output projection
    #: maps back to d_model); head_dim = attn_dim / n_heads. None = d_model (LRA's "qkv_dim").
    attn_dim: int | None = None
    #: Biases in the attention's qkv and output projections (LRA's Transformers have none).
    attn_bias: bool = True
    #: Dropout on the attention probabilities, in training only (LRA's attention_dropout_rate).
    attn_dropout: float = 0.0
    # Rotary embeddings: inside attention for attention; before the SSM for Mamba blocks (thesis 14.3)
    rope: bool = False
    rope_base: float = 10000.0
    rope_trainable: bool = False
    rope_normalize_len: int | None = None
    rope_targets: tuple[str, ...] = ("x",)
    # Encoder and head
    pos_embedding: str = "none"
    max_len: int = 0
    pooling: str = "mean"
    # Pooled (classification/regression) head: 1 = linear, 2 = MLP Linear(d, hidden) -> act -> Linear,
    # 3 = Linear(d, hidden) -> act -> Linear(hidden, hidden // 2) -> act -> Linear (LRA's dual head).
    # The retrieval head: 1 or 2 = the S4/SPT head, two layers on [a, b, a*b, a-b]; 3 = LRA's
    # three layers on [a, b]. hidden and activation apply to every MLP head.
    head_layers: int = 1
    head_hidden: int | None = None
    head_activation: str = "gelu"
    # Extra keyword arguments for the primitive (e.g. {"init": "lin", "discretization": "bilinear"})
    primitive_options: dict[str, Any] = field(default_factory=dict)
    # block "hf": a Hugging Face causal LM {model, pretrained, config, revision} (see models/hf.py)
    hf: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rope_targets = tuple(self.rope_targets)
        self.validate()

    @property
    def bidirectional(self) -> bool:
        return self.direction == "bidirectional"

    @property
    def resolved_norm(self) -> str:
        return self.norm if self.norm is not None else _BLOCK_DEFAULTS.get(self.block, _OTHER_BLOCK)["norm"]

    @property
    def resolved_prenorm(self) -> bool:
        return self.prenorm if self.prenorm is not None else _BLOCK_DEFAULTS.get(self.block, _OTHER_BLOCK)["prenorm"]

    def validate(self) -> None:
        def choice(name: str, options, hint: str = "") -> None:
            value = getattr(self, name)
            if value not in options:
                known = list(options)
                raise ConfigError(f"model.{name} = {value!r} is not one of {', '.join(known)}"
                                  f"{typed.did_you_mean(value, known, quote=True)}{hint}")

        choice("block", BLOCKS, f"; {PLUGIN_HINT}")
        choice("primitive", PRIMITIVES, f"; {PLUGIN_HINT}")
        choice("direction", DIRECTIONS)
        choice("pooling", POOLINGS)
        choice("pos_embedding", POSITIONAL)
        choice("head_activation", HEAD_ACTIVATIONS)
        choice("mlp", MLPS)
        if self.mlp != "swiglu" and self.block != "residual":
            raise ConfigError(f"model.mlp applies to the residual block, not to block {self.block!r}")
        if self.head_layers not in HEAD_LAYERS:
            raise ConfigError(
                f"model.head_layers must be 1 (linear), 2 (MLP) or 3 (LRA's three-layer MLP), got {self.head_layers!r}"
            )
        if self.head_hidden is not None and self.head_hidden < 1:
            raise ConfigError(f"model.head_hidden must be None (= d_model) or positive, got {self.head_hidden}")
        if self.block == "hf":
            check_hf_spec(self.hf)
            if self.direction != "causal":
                raise ConfigError(
                    f"model.block 'hf' wraps a causal language model: model.direction must be 'causal', got {self.direction!r}"
                )
        elif self.hf:
            raise ConfigError(f"model.hf applies to model.block 'hf', not {self.block!r}")
        if self.block == "transformer" and self.primitive != "attention":
            raise ConfigError(f"model.block = 'transformer' holds attention, not {self.primitive!r}")
        if self.direction == "placebo" and self.block != "mamba":
            raise ConfigError("model.direction = 'placebo' exists for Mamba blocks only")
        for name in ("n_layers", "d_model", "d_state", "expand", "d_conv", "n_heads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name} must be positive, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
        for name in ("attn_block_size", "attn_window"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"model.{name} must be None or a positive int, got {value!r}")
        if self.attn_block_size is not None and self.attn_window is not None:
            raise ConfigError(
                "model.attn_block_size (isolated blocks) and model.attn_window (sliding windows) exclude each other; set one"
            )
        if self.attn_window is not None and self.primitive != "attention":
            raise ConfigError(f"model.attn_window applies to attention, not to primitive {self.primitive!r}")
        if self.attn_dim is not None:
            if not isinstance(self.attn_dim, int) or isinstance(self.attn_dim, bool) or self.attn_dim < 1:
                raise ConfigError(f"model.attn_dim must be None (= d_model) or a positive int, got {self.attn_dim!r}")
            if self.primitive != "attention":
                raise ConfigError(f"model.attn_dim applies to attention, not to primitive {self.primitive!r}")
            if self.attn_dim % self.n_heads:
                raise ConfigError(
                    f"model.attn_dim = {self.attn_dim} is not divisible by model.n_heads = {self.n_heads} "
                    "(each head gets attn_dim / n_heads features)"
                )
        if not isinstance(self.attn_bias, bool):
            raise ConfigError(f"model.attn_bias must be true or false, got {self.attn_bias!r}")
        if not self.attn_bias and self.primitive != "attention":
            raise ConfigError(f"model.attn_bias applies to attention, not to primitive {self.primitive!r}")
        if isinstance(self.attn_dropout, bool) or not 0.0 <= self.attn_dropout < 1.0:
            raise ConfigError(f"model.attn_dropout must be in [0, 1), got {self.attn_dropout!r}")
        if self.attn_dropout and self.primitive != "attention":
            raise ConfigError(f"model.attn_dropout applies to attention, not to primitive {self.primitive!r}")
        if not isinstance(self.output_glu, bool):
            raise ConfigError(f"model.output_glu must be true or false, got {self.output_glu!r}")
        if not self.output_glu and self.block != "simple":
            raise ConfigError(
                f"model.output_glu applies to the simple block (the S4 layer's output), not to block {self.block!r}"
            )
        if self.pos_embedding == "learned" and self.max_len < 1:
            raise ConfigError("model.pos_embedding = 'learned' needs model.max_len (the longest input)")

    def describe(self) -> str:
        """One line naming the model by the fields that build it: a Hugging Face LM by its id and
        weights (``hf: EleutherAI/pythia-70m-deduped, pretrained`` or ``random init``); any other model
        by block, primitive, direction and sizes (the state size only for primitives that have one,
        the heads for attention)."""
        if self.block == "hf":
            weights = "pretrained" if self.hf.get("pretrained", False) else "random init"
            return f"hf: {self.hf.get('model')}, {weights}"
        size = f"L={self.n_layers} d={self.d_model}"
        if self.primitive == "attention":
            size += f" heads={self.n_heads}"
        elif PRIMITIVES.accepts(self.primitive, "d_state", 1):
            size += f" N={self.d_state}"
        return f"{self.block}-{self.primitive} {self.direction} {size}"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["rope_targets"] = list(self.rope_targets)
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str = "model") -> "ModelConfig":
        """Build from plain values (YAML, overrides); unknown fields and wrong types raise ConfigError
        naming the dotted field (see ``longrange.typed``)."""
        return typed.from_dict(cls, d, where)

    def replace(self, where: str = "model", **changes: Any) -> "ModelConfig":
        return ModelConfig.from_dict({**self.to_dict(), **changes}, where)


#: Fields at their default are left out of a run's identity (a new field changes no fingerprint).
declare_defaults("model", lambda: ModelConfig().to_dict())


def check_hf_spec(hf: Any) -> None:
    """Check ``model.hf`` without importing transformers (ConfigError naming the field)."""
    if not isinstance(hf, dict):
        raise ConfigError(f"model.hf must be a mapping {{model, pretrained, config, revision}}, got {hf!r}")
    unknown = sorted(set(hf) - set(HF_KEYS))
    if unknown:
        raise ConfigError(f"unknown model.hf key(s) {', '.join(unknown)}; known: {', '.join(HF_KEYS)}")
    if not isinstance(hf.get("model"), str) or not hf["model"]:
        raise ConfigError(f"model.hf.model must name a Hugging Face model id or local directory, got {hf.get('model')!r}")
    if not isinstance(hf.get("pretrained", False), bool):
        raise ConfigError(f"model.hf.pretrained must be true or false, got {hf['pretrained']!r}")
    if not isinstance(hf.get("config") or {}, dict):
        raise ConfigError(f"model.hf.config must be a mapping of configuration overrides, got {hf['config']!r}")
    if hf.get("revision") is not None and not isinstance(hf["revision"], str):
        raise ConfigError(f"model.hf.revision must be a string, got {hf['revision']!r}")
