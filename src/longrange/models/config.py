"""The model configuration: a plain dataclass, saved with every run and overridable by dotted name."""

from __future__ import annotations

import dataclasses
import math
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
INIT_SCHEMES = ("default", "gpt2", "mamba")  # models/init.py
MLPS = ("swiglu", "gelu", "none")  # blocks/residual.py
#: Names in ``model.layers`` that are channel mixers, a layer of their own (norm -> MLP -> residual;
#: blocks/residual.py ``ChannelMixerBlock``): the MLP each stands for.
CHANNEL_MIXERS = {"swiglu": "swiglu", "mlp": "gelu"}
#: Model fields a ``model.layers`` entry written as a mapping may set for its layer alone.
LAYER_FIELDS = (
    "d_state",
    "n_heads",
    "expand",
    "d_conv",
    "mlp",
    "mlp_ratio",
    "norm",
    "prenorm",
    "rope",
    "rope_base",
    "attn_block_size",
    "attn_window",
    "attn_dim",
    "attn_bias",
    "attn_dropout",
    "output_glu",
)
#: ... and those a channel mixer's entry may set.
CHANNEL_MIXER_FIELDS = ("mlp_ratio", "norm", "prenorm")
#: The keys of a ``model.layers`` entry written as a mapping.
LAYER_KEYS = ("primitive", "block", "options", *LAYER_FIELDS)
#: Model-wide settings that concern only some layers of a stack: (field, default, the layers it concerns).
_ATTENTION_FIELDS = {"attn_window": None, "attn_dim": None, "attn_bias": True, "attn_dropout": 0.0}

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


@dataclass(frozen=True)
class Layer:
    """One layer of a model's stack (:meth:`ModelConfig.stack`): a sequence mixer in its block
    (``cfg`` is the layer's own config: the model's, with this layer's block, primitive and
    options), or a channel mixer (``mlp``: "swiglu" or "gelu", and ``cfg`` the model's)."""

    index: int
    name: str
    cfg: ModelConfig
    mlp: str | None = None
    #: A channel mixer's own settings (``mlp_ratio``, ``norm``, ``prenorm``) where its entry sets them.
    own: dict[str, Any] = field(default_factory=dict)
    #: The layer's entry in ``model.layers`` (None in a model of one primitive).
    entry: int | None = None

    @property
    def stacked(self) -> bool:
        return self.entry is not None

    @property
    def is_channel_mixer(self) -> bool:
        return self.mlp is not None


@dataclass
class ModelConfig:
    """A sequence model: encoder -> ``n_layers`` blocks -> head.

    ``block`` is the block type and ``primitive`` the sequence primitive inside it (the Transformer
    block always holds attention); ``block="hf"`` wraps the Hugging Face causal LM that ``hf``
    names instead (``longrange.models.hf``), whose own configuration gives width and depth.
    ``direction`` is "causal", "bidirectional" or, for Mamba blocks,
    "placebo" (the bidirectional block's parameters without the flips).

    A hybrid stack sets ``layers`` instead of ``primitive``: a pattern of layers repeated to fill
    ``n_layers`` (see the field's comment and :meth:`stack`).
    """

    #: The block each layer is (``transformer`` holds attention; ``hf``: a Hugging Face LM, see ``hf``).
    block: str = "mamba"
    #: The sequence primitive inside each block; its own options are ``primitive_options``.
    primitive: str = "s6"
    #: Blocks in the backbone.
    n_layers: int = 6
    #: Width of the model: the encoder's output and every block's input and output.
    d_model: int = 116
    #: State size N of the primitives that have one (passed to those whose constructor names ``d_state``).
    d_state: int = 16
    #: "causal" (each position sees those before it), "bidirectional", or for Mamba blocks "placebo"
    #: (the bidirectional block's parameters without the flips).
    direction: str = "causal"
    #: Dropout in every block.
    dropout: float = 0.0
    #: The blocks' normalisation; None = the block's own (rms for Mamba and residual blocks, layer
    #: for the others).
    norm: str | None = None
    #: Normalise before the mixer (pre-norm, True) or after the residual sum (post-norm, False);
    #: None = the block's own (post-norm for the simple block, pre-norm for the others).
    prenorm: bool | None = None
    #: Simple block: the output Linear(d, 2d) + GLU of the later S4 code (True), or the original
    #: S4 layer's Linear(d, d) without a GLU (False; the S4 code at tag v1).
    output_glu: bool = True
    # Mamba block
    #: Mamba block: its inner width, as a multiple of d_model.
    expand: int = 2
    #: Mamba block: the width of the causal depthwise convolution before the primitive.
    d_conv: int = 4
    # Attention / Transformer block
    #: Attention heads (and the heads of primitives whose constructor names ``n_heads``).
    n_heads: int = 8
    #: Transformer and residual blocks: the MLP's hidden width, as a multiple of d_model.
    mlp_ratio: float = 4.0
    #: Residual block: the MLP after the mixer, "swiglu", "gelu" or "none" (blocks/residual.py).
    mlp: str = "swiglu"
    #: Blocked (local) attention: each position attends only within consecutive, non-overlapping
    #: blocks of this many positions. None = dense.
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
    #: Rotary position embeddings: inside attention for attention; on the primitive's input in Mamba
    #: blocks (thesis section 14.3).
    rope: bool = False
    #: RoPE's base: the rotation frequencies are base^(-2i/d).
    rope_base: float = 10000.0
    #: The rotation frequencies are learned (initialised by the formula) instead of fixed.
    rope_trainable: bool = False
    #: Scale the rotations so that the largest relative rotation over this many positions is π;
    #: None = unscaled.
    rope_normalize_len: int | None = None
    #: Mamba blocks with S6: which of S6's inputs are computed from the rotated input.
    rope_targets: tuple[str, ...] = ("x",)
    # Encoder and head
    #: Absolute positions added by the encoder: "none", "learned" (a table of ``max_len``
    #: positions) or "sinusoidal".
    pos_embedding: str = "none"
    #: The longest input, for ``pos_embedding: learned`` (its table's size); 0 = unused.
    max_len: int = 0
    #: How a pooled head reads the sequence: the mean or the maximum over real positions, the last
    #: real position, or a learned CLS vector ("cls": first for bidirectional models, after the last
    #: real position for causal ones).
    pooling: str = "mean"
    #: Pooled (classification/regression) head: 1 = linear, 2 = MLP Linear(d, hidden) -> act -> Linear,
    #: 3 = Linear(d, hidden) -> act -> Linear(hidden, hidden // 2) -> act -> Linear (LRA's dual head).
    #: The retrieval head: 1 or 2 = the S4/SPT head, two layers on [a, b, a*b, a-b]; 3 = LRA's
    #: three layers on [a, b]. hidden and activation apply to every MLP head.
    head_layers: int = 1
    #: The MLP heads' hidden width; None = d_model.
    head_hidden: int | None = None
    #: The MLP heads' activation.
    head_activation: str = "gelu"
    # Initialisation (models/init.py)
    #: How the whole model is initialised: "default" (each layer's own initialisation, PyTorch's
    #: for its linear maps), "gpt2" (every linear and embedding weight N(0, init_std), linear biases
    #: 0: Zoology's TransformerBlock models, H3's language models) or "mamba" (embeddings
    #: N(0, init_std), linear biases 0, linear weights the layers' own: mamba_ssm's, Zoology's Mamba
    #: blocks, mad-lab's language model). The output head is a linear map to both; a parameter its
    #: layer marks as keeping its initialisation (S6's time-step bias) keeps it.
    init: str = "default"
    #: The standard deviation of the ``gpt2`` and ``mamba`` schemes.
    init_std: float = 0.02
    #: The source's residual output projections: glob patterns over the model's parameter names
    #: (e.g. "*.mixer.out_proj.weight"), drawn N(0, init_std / sqrt(2 n_layers)) by "gpt2" and as
    #: PyTorch's linear weights divided by sqrt(n_layers) by "mamba". A pattern naming no parameter is
    #: an error.
    init_rescaled: tuple[str, ...] = ()
    #: Extra keyword arguments for the primitive (e.g. {"init": "lin", "discretization": "bilinear"});
    #: ``longrange list primitive NAME`` lists a primitive's options and their defaults.
    primitive_options: dict[str, Any] = field(default_factory=dict)
    #: Block "hf": a Hugging Face causal LM {model, pretrained, config, revision} (see models/hf.py).
    hf: dict[str, Any] = field(default_factory=dict)
    #: A hybrid stack: the layers' pattern, repeated to fill ``n_layers`` (which must be a multiple of
    #: its length; left unset in a YAML file or override, ``n_layers`` is the pattern's length). Each
    #: entry is a primitive's name (in ``block``, with the model's settings), a channel mixer
    #: ("swiglu", or "mlp" for the GELU MLP: a layer of its own, norm -> MLP -> residual), or a mapping
    #: ``{primitive, block, options, ...}`` for a layer in another block, with its own primitive options
    #: or with model fields of its own (``d_state``, ``n_heads``, ``mlp``, ``mlp_ratio``, ``rope``,
    #: ``attn_*``, ...: ``LAYER_FIELDS``). Empty: every layer is ``primitive`` in ``block``
    #: (``primitive`` and ``primitive_options`` are not used by a stack). Model-wide settings apply
    #: to the layers they concern (``attn_*`` to attention, ``mlp`` to residual blocks, ``rope`` to
    #: attention and primitives with rotary positions of their own).
    layers: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rope_targets = tuple(self.rope_targets)
        if isinstance(self.init_rescaled, list):
            self.init_rescaled = tuple(self.init_rescaled)
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
                raise ConfigError(
                    f"model.{name} = {value!r} is not one of {', '.join(known)}"
                    f"{typed.did_you_mean(value, known, quote=True)}{hint}"
                )

        choice("block", BLOCKS, f"; {PLUGIN_HINT}")
        choice("primitive", PRIMITIVES, f"; {PLUGIN_HINT}")
        choice("direction", DIRECTIONS)
        choice("pooling", POOLINGS)
        choice("pos_embedding", POSITIONAL)
        choice("head_activation", HEAD_ACTIVATIONS)
        choice("mlp", MLPS)
        choice("init", INIT_SCHEMES)
        self._validate_init()
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
        if self.attn_dim is not None:
            if not isinstance(self.attn_dim, int) or isinstance(self.attn_dim, bool) or self.attn_dim < 1:
                raise ConfigError(f"model.attn_dim must be None (= d_model) or a positive int, got {self.attn_dim!r}")
            if self.attn_dim % self.n_heads:
                raise ConfigError(
                    f"model.attn_dim = {self.attn_dim} is not divisible by model.n_heads = {self.n_heads} "
                    "(each head gets attn_dim / n_heads features)"
                )
        if not isinstance(self.attn_bias, bool):
            raise ConfigError(f"model.attn_bias must be true or false, got {self.attn_bias!r}")
        if isinstance(self.attn_dropout, bool) or not 0.0 <= self.attn_dropout < 1.0:
            raise ConfigError(f"model.attn_dropout must be in [0, 1), got {self.attn_dropout!r}")
        if not isinstance(self.output_glu, bool):
            raise ConfigError(f"model.output_glu must be true or false, got {self.output_glu!r}")
        if self.pos_embedding == "learned" and self.max_len < 1:
            raise ConfigError("model.pos_embedding = 'learned' needs model.max_len (the longest input)")
        if self.layers:
            self._validate_stack()
        else:
            self._validate_layer()

    def _validate_layer(self) -> None:
        """The settings that concern one block and primitive, for a model of one primitive (and
        for each layer of a stack)."""
        if self.mlp != "swiglu" and self.block != "residual":
            raise ConfigError(f"model.mlp applies to the residual block, not to block {self.block!r}")
        if self.block == "transformer" and self.primitive != "attention":
            raise ConfigError(f"model.block = 'transformer' holds attention, not {self.primitive!r}")
        if self.direction == "placebo" and self.block != "mamba":
            raise ConfigError("model.direction = 'placebo' exists for Mamba blocks only")
        for name, default in _ATTENTION_FIELDS.items():
            if getattr(self, name) != default and self.primitive != "attention":
                raise ConfigError(f"model.{name} applies to attention, not to primitive {self.primitive!r}")
        if not self.output_glu and self.block != "simple":
            raise ConfigError(
                f"model.output_glu applies to the simple block (the S4 layer's output), not to block {self.block!r}"
            )

    def _validate_init(self) -> None:
        std = self.init_std
        if isinstance(std, bool) or not isinstance(std, (int, float)) or not 0.0 < std < math.inf:
            raise ConfigError(f"model.init_std must be a positive number, got {std!r}")
        patterns = self.init_rescaled
        if not isinstance(patterns, tuple) or not all(isinstance(p, str) and p for p in patterns):
            raise ConfigError(
                f"model.init_rescaled must be a list of parameter-name patterns (strings), got {patterns!r}"
            )
        if patterns and self.init == "default":
            raise ConfigError(
                "model.init_rescaled applies to the 'gpt2' and 'mamba' initialisations, not to model.init 'default'"
            )
        if self.init != "default" and self.block == "hf":
            raise ConfigError(f"model.init {self.init!r} does not apply to model.block 'hf' (a pretrained model's own)")

    def _validate_stack(self) -> None:
        if self.block == "hf":
            raise ConfigError("model.layers builds a stack of blocks; model.block 'hf' is a whole model")
        if not isinstance(self.layers, list):
            raise ConfigError(f"model.layers must be a list of layers, got {self.layers!r}")
        if self.primitive_options:
            raise ConfigError(
                "model.primitive_options applies to model.primitive, which a stack (model.layers) does "
                "not use; give a layer its options as {primitive: NAME, options: {...}}"
            )
        if self.n_layers % len(self.layers):
            n = len(self.layers)
            raise ConfigError(
                f"model.n_layers = {self.n_layers} is not a multiple of the {n} entries of model.layers "
                f"(the stack repeats them): set model.n_layers to {n}, {2 * n}, ..."
            )
        layers = self.stack()
        if all(layer.is_channel_mixer for layer in layers):
            raise ConfigError("model.layers has only channel mixers (swiglu, mlp): a model needs a sequence mixer")
        mixers = [layer.cfg for layer in layers if not layer.is_channel_mixer]
        uses = {
            "attn_*": any(c.primitive == "attention" for c in mixers),
            "mlp": any(c.block == "residual" for c in mixers),
            "output_glu": any(c.block == "simple" for c in mixers),
            "rope": any(c.rope for c in mixers),
        }
        concerned = {
            "attn_*": "attention",
            "mlp": "the residual block",
            "output_glu": "the simple block",
            "rope": "attention, primitives with rotary positions of their own, and Mamba blocks",
        }
        changed = {
            **{n: "attn_*" for n, d in _ATTENTION_FIELDS.items() if getattr(self, n) != d},
            **({"mlp": "mlp"} if self.mlp != "swiglu" else {}),
            **({"output_glu": "output_glu"} if not self.output_glu else {}),
            **({"rope": "rope"} if self.rope else {}),
        }
        for name, key in changed.items():
            if not uses[key]:
                raise ConfigError(f"model.{name} applies to {concerned[key]}, which no layer of model.layers is")

    def _layer_entry(self, i: int, entry: Any) -> tuple[str, str | None, dict[str, Any], dict[str, Any]]:
        """``(primitive or channel mixer, block or None, options, the layer's own model fields)`` of
        ``model.layers[i]``."""
        where = f"model.layers[{i}]"
        own: dict[str, Any] = {}
        if isinstance(entry, str):
            primitive, block, options = entry, None, {}
        elif isinstance(entry, dict):
            unknown = sorted(set(entry) - set(LAYER_KEYS))
            if unknown:
                raise typed.unknown_fields_error(unknown, LAYER_KEYS, where)
            primitive, block, options = entry.get("primitive"), entry.get("block"), entry.get("options") or {}
            hints = typed.field_types(ModelConfig)
            own = {k: typed.convert(v, hints[k], f"{where}.{k}") for k, v in entry.items() if k in LAYER_FIELDS}
            if not isinstance(primitive, str):
                raise ConfigError(f"{where}.primitive must name a primitive, got {primitive!r}")
            if block is not None and not isinstance(block, str):
                raise ConfigError(f"{where}.block must name a block, got {block!r}")
            if not isinstance(options, dict):
                raise ConfigError(f"{where}.options must be a mapping of the primitive's options, got {options!r}")
            other = sorted(set(own) - set(CHANNEL_MIXER_FIELDS))
            if primitive in CHANNEL_MIXERS and (block is not None or options or other):
                given = ["block"] * (block is not None) + ["options"] * bool(options) + other
                raise ConfigError(
                    f"{where}: the channel mixer {primitive!r} takes only "
                    f"{', '.join(CHANNEL_MIXER_FIELDS)}, not {', '.join(given)}"
                )
        else:
            raise ConfigError(
                f"{where} must be a primitive's name or a mapping {{primitive, block, options, ...}}, got {entry!r}"
            )
        if primitive not in CHANNEL_MIXERS and primitive not in PRIMITIVES:
            known = [*PRIMITIVES, *CHANNEL_MIXERS]
            raise ConfigError(
                f"{where} = {primitive!r} is neither a primitive nor a channel mixer "
                f"({', '.join(known)}){typed.did_you_mean(primitive, known, quote=True)}; {PLUGIN_HINT}"
            )
        if block is not None and block not in BLOCKS:
            raise ConfigError(
                f"{where}.block = {block!r} is not one of {', '.join(BLOCKS)}"
                f"{typed.did_you_mean(block, list(BLOCKS), quote=True)}"
            )
        return primitive, block, dict(options), own

    def _layer_config(self, primitive: str, block: str, options: dict[str, Any], own: dict[str, Any]) -> ModelConfig:
        """The config of one layer of the stack: the model's, with the settings that concern other
        layers left at their defaults and the layer's own fields (``own``) on top."""
        attention = primitive == "attention"
        changes: dict[str, Any] = {
            "primitive": primitive,
            "block": block,
            "primitive_options": options,
            "layers": [],
            "n_layers": 1,
        }
        if not attention:
            changes.update(_ATTENTION_FIELDS)
        if block != "residual":
            changes["mlp"] = "swiglu"
        if block != "simple":
            changes["output_glu"] = True
        if self.rope and not (attention or PRIMITIVES.accepts(primitive, "rope", 1)):
            changes["rope"] = False  # in a stack, a Mamba block rotates its input only if its entry says so
        return dataclasses.replace(self, **{**changes, **own})

    def stack(self) -> list[Layer]:
        """The model's layers, first to last: ``n_layers`` times ``primitive`` in ``block``, or the
        pattern of ``layers`` repeated to fill ``n_layers``. A layer whose settings conflict raises a
        ConfigError naming its entry."""
        if not self.layers:
            name = f"{self.block}-{self.primitive}"
            return [Layer(i, name, self) for i in range(self.n_layers)]
        pattern = []
        for i, entry in enumerate(self.layers):
            primitive, block, options, own = self._layer_entry(i, entry)
            if primitive in CHANNEL_MIXERS:
                pattern.append((primitive, self, CHANNEL_MIXERS[primitive], own))
                continue
            block = block or self.block
            try:
                cfg = self._layer_config(primitive, block, options, own)
            except ConfigError as err:
                message = str(err)
                for name in own:
                    message = message.replace(f"model.{name} ", f"model.layers[{i}].{name} ")
                raise ConfigError(f"model.layers[{i}] ({primitive}): {message}") from None
            pattern.append((primitive if block == self.block else f"{block}-{primitive}", cfg, None, {}))
        return [Layer(i, *pattern[i % len(pattern)], entry=i % len(pattern)) for i in range(self.n_layers)]

    @property
    def name(self) -> str:
        """The model's architecture in a few characters: ``mamba-s6``, or for a stack its block and
        pattern, runs of one layer counted and the repeats after it: ``residual[mamba2*3,attention]*2``."""
        if not self.layers:
            return f"{self.block}-{self.primitive}"
        names = [layer.name for layer in self.stack()[: len(self.layers)]]
        runs: list[list] = []
        for n in names:
            if runs and runs[-1][0] == n:
                runs[-1][1] += 1
            else:
                runs.append([n, 1])
        inner = ",".join(n if k == 1 else f"{n}*{k}" for n, k in runs)
        repeats = self.n_layers // len(self.layers)
        return f"{self.block}[{inner}]" + (f"*{repeats}" if repeats > 1 else "")

    def describe(self) -> str:
        """One line naming the model by the fields that build it: a Hugging Face LM by its id and
        weights (``hf: EleutherAI/pythia-70m-deduped, pretrained`` or ``random init``); any other model
        by its :attr:`name`, direction and sizes (the state size only where a primitive has one, the
        heads where there is attention)."""
        if self.block == "hf":
            weights = "pretrained" if self.hf.get("pretrained", False) else "random init"
            return f"hf: {self.hf.get('model')}, {weights}"
        size = f"L={self.n_layers} d={self.d_model}"
        primitives = {layer.cfg.primitive for layer in self.stack() if not layer.is_channel_mixer}
        if "attention" in primitives:
            size += f" heads={self.n_heads}"
        if any(PRIMITIVES.accepts(p, "d_state", 1) for p in primitives):
            size += f" N={self.d_state}"
        return f"{self.name} {self.direction} {size}"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["rope_targets"] = list(self.rope_targets)
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str = "model") -> ModelConfig:
        """Build from plain values (YAML, overrides); unknown fields and wrong types raise ConfigError
        naming the dotted field (see ``longrange.typed``). With ``layers`` and no ``n_layers``, the
        model has one repeat of the pattern."""
        if isinstance(d, dict) and d.get("layers") and "n_layers" not in d and isinstance(d["layers"], list):
            d = {**d, "n_layers": len(d["layers"])}
        return typed.from_dict(cls, d, where)

    def replace(self, where: str = "model", **changes: Any) -> ModelConfig:
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
        raise ConfigError(
            f"model.hf.model must name a Hugging Face model id or local directory, got {hf.get('model')!r}"
        )
    if not isinstance(hf.get("pretrained", False), bool):
        raise ConfigError(f"model.hf.pretrained must be true or false, got {hf['pretrained']!r}")
    if not isinstance(hf.get("config") or {}, dict):
        raise ConfigError(f"model.hf.config must be a mapping of configuration overrides, got {hf['config']!r}")
    if hf.get("revision") is not None and not isinstance(hf["revision"], str):
        raise ConfigError(f"model.hf.revision must be a string, got {hf['revision']!r}")
