"""The sequence model (encoder -> backbone -> head), its builder and its parameter report.

One model class serves pretraining and finetuning: the encoder and backbone are kept, and the
head is what changes (``replace_head``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from longrange.errors import ConfigError
from longrange.models.backbone import Backbone
from longrange.models.config import ModelConfig
from longrange.models.encoders import NumericEncoder, TokenEncoder
from longrange.models.init import init_head, initialise
from longrange.models.registry import BLOCKS, HEADS, builds_model
from longrange.ops.dataless import holds_data
from longrange.ops.masks import padding_mask


def unpadded(lengths: Tensor, length: int) -> bool:
    """Whether every sequence of ``lengths`` (batch,) fills all ``length`` positions, known without a
    device synchronisation: on host tensors only (a batch as collated), False for device tensors,
    in code being compiled (where the check would be a data-dependent branch, and Inductor fuses the
    masks' products anyway) and for tensors without data (dry runs and plans, which so predict a
    GPU run's step).

    The backbone then gets no padding mask, and its layers skip their masked multiplications (a
    product per masked tensor, forward and backward: 1-6% of the small models' training step on a
    CPU); an all-True mask and none give the same outputs.
    """
    if lengths.device.type != "cpu" or torch.compiler.is_compiling() or not holds_data(lengths):
        return False
    return lengths.numel() == 0 or int(lengths.min()) >= length


def make_head(kind: str, d_model: int, n_out: int, pooling: str = "mean", **settings: Any) -> nn.Module:
    """A head by kind (see :data:`~longrange.models.registry.HEADS`): "classify" and "regress"
    (pooled), "retrieval" (two sequences), "tokens" (per position), "decode-last" (every position
    from the last). ``pooling`` and ``settings`` go to the heads whose constructors take them."""
    if n_out < 1:
        raise ConfigError(f"head {kind!r} needs a positive output size, got {n_out}")
    return HEADS.build_from(kind, (d_model, n_out), offered={"pooling": pooling, **settings})


def config_head(cfg: ModelConfig, kind: str, n_out: int, d_model: int | None = None) -> nn.Module:
    """The head of ``kind`` that ``cfg`` describes (pooling and head_* fields) on features of width ``d_model``."""
    return make_head(
        kind,
        d_model or cfg.d_model,
        n_out,
        cfg.pooling,
        layers=cfg.head_layers,
        hidden=cfg.head_hidden,
        activation=cfg.head_activation,
    )


class SequenceModel(nn.Module):
    """encoder -> backbone -> head. ``backbone`` defaults to the blocks of ``cfg``
    (:class:`~longrange.models.backbone.Backbone`); a variant passes its own (any module with
    ``d_model``, ``forward(x, mask)``, ``default_state``, ``step`` and ``mixers``) and may override
    :meth:`embed` and :meth:`embed_step`, the only steps that depend on the encoder."""

    def __init__(
        self, cfg: ModelConfig, encoder: nn.Module, head_kind: str, n_out: int, backbone: nn.Module | None = None
    ):
        super().__init__()
        self.cfg = cfg
        self.encoder = encoder
        self.backbone = Backbone(cfg) if backbone is None else backbone
        self.d_features = self.backbone.d_model
        self.head_kind = head_kind
        self.head = config_head(cfg, head_kind, n_out, self.d_features)
        # A learned CLS vector for cls pooling: first for bidirectional models, after the last
        # real position for causal ones (so that it sees the whole sequence).
        self.cls = nn.Parameter(torch.randn(self.d_features) * 0.02) if cfg.pooling == "cls" else None
        initialise(self, cfg)

    @property
    def causal(self) -> bool:
        return not self.cfg.bidirectional

    @property
    def per_position(self) -> bool:
        """Whether the head gives an output per position (token prediction)."""
        return bool(getattr(self.head, "per_position", False))

    def replace_head(self, kind: str, n_out: int) -> None:
        """Swap the head (e.g. token prediction -> classification) on the same device and dtype."""
        ref = next(self.backbone.parameters())
        self.head_kind = kind
        head = config_head(self.cfg, kind, n_out, self.d_features)
        init_head(head, self.cfg.init, self.cfg.init_std)
        self.head = head.to(ref.device, ref.dtype)

    def embed(self, inputs: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """Inputs -> (embeddings (batch, L', d), their lengths, and the position in L' of each input
        position, or None when L' = L)."""
        return self.encoder(inputs), lengths, None

    def embed_step(self, x_t: Tensor, pos: int) -> Tensor:
        """One position's input (batch,) or (batch, channels) at position ``pos`` -> (batch, d)."""
        return self.encoder(x_t.unsqueeze(1), offset=pos).squeeze(1)

    def encode(self, inputs: Tensor, lengths: Tensor | None = None, return_ends: bool = False):
        """Features (batch, length', d), their padding mask, and the CLS positions (or None); with
        ``return_ends`` also the feature position of each input position (None when one-to-one)."""
        batch = inputs.shape[0]
        if lengths is None:
            lengths = torch.full((batch,), inputs.shape[1], dtype=torch.long, device=inputs.device)
        elif lengths.shape != (batch,):
            raise ValueError(f"lengths must have shape ({batch},), got {tuple(lengths.shape)}")
        x, lengths, ends = self.embed(inputs, lengths)
        cls_index = None
        if self.cls is not None and not self.per_position:
            cls = self.cls.to(x.dtype).expand(batch, 1, -1)
            if self.causal:
                x = torch.cat([x, torch.zeros_like(cls)], dim=1)
                cls_index = lengths.to(x.device)
                x = x.index_put((torch.arange(batch, device=x.device), cls_index), cls[:, 0])
            else:
                x = torch.cat([cls, x], dim=1)
                cls_index = torch.zeros(batch, dtype=torch.long, device=x.device)
            lengths = lengths + 1
        mask = padding_mask(lengths.to(x.device), x.shape[1])
        h = self.backbone(x, None if unpadded(lengths, x.shape[1]) else mask)
        return (h, mask, cls_index, ends) if return_ends else (h, mask, cls_index)

    def forward(
        self,
        inputs: Tensor,
        lengths: Tensor | None = None,
        inputs2: Tensor | None = None,
        lengths2: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """The head's outputs: (batch, n_out) for pooled heads, (batch, length, n_out) per position.

        ``positions``, a boolean (batch, length) mask, applies a per-position head at those input
        positions only and returns (number of True positions, n_out) in row-major order: the same
        rows as ``forward(inputs, lengths)[positions]``, without the head's outputs elsewhere.
        """
        h, mask, cls_index, ends = self.encode(inputs, lengths, return_ends=True)
        if getattr(self.head, "two_sequences", False):
            if inputs2 is None:
                raise ValueError("a retrieval model needs the second sequence (inputs2)")
            h2, mask2, cls2 = self.encode(inputs2, lengths2)
            return self.head(h, mask, h2, mask2, cls_index, cls2)
        if self.per_position and ends is not None:
            h = h.gather(1, ends.unsqueeze(-1).expand(-1, -1, h.shape[-1]))  # back to input positions
        if positions is not None:
            if not self.per_position:
                raise ValueError(
                    f"positions select outputs of a per-position head; the model has a {self.head_kind!r} head"
                )
            if positions.shape != inputs.shape[:2] or positions.dtype != torch.bool:
                raise ValueError(
                    f"positions must be a boolean mask of the inputs' shape {tuple(inputs.shape[:2])}, "
                    f"got {positions.dtype} {tuple(positions.shape)}"
                )
            if getattr(self.head, "reads_sequence", False):  # every output needs the whole sequence
                return self.head(h, mask, cls_index)[positions.to(h.device)]
            return self.head(h[positions.to(h.device)])
        return self.head(h, mask, cls_index)

    # Recurrent generation (causal models with a token head)
    def default_state(self, batch_size: int, device=None, dtype=None) -> dict[str, Any]:
        if not self.causal:
            raise RuntimeError("a bidirectional model has no recurrent mode")
        return {"pos": 0, "backbone": self.backbone.default_state(batch_size, device=device, dtype=dtype)}

    def step(self, x_t: Tensor, state: dict[str, Any]) -> tuple[Tensor, dict[str, Any]]:
        """One position: x_t (batch,) token ids or (batch, channels) values -> head output (batch, n_out)."""
        if not self.per_position:
            raise RuntimeError(f"step() produces per-position outputs; the model has a {self.head_kind!r} head")
        if getattr(self.head, "reads_sequence", False):
            raise RuntimeError(
                f"the {self.head_kind!r} head decodes every position from the last one: it has no recurrent step"
            )
        h, backbone_state = self.backbone.step(self.embed_step(x_t, state["pos"]), state["backbone"])
        return self.head(h), {"pos": state["pos"] + 1, "backbone": backbone_state}


def build_model(
    cfg: ModelConfig,
    *,
    input_kind: str,
    head: str,
    n_out: int,
    vocab_size: int | None = None,
    d_input: int | None = None,
    mask_channel: bool = False,
    vocab: Sequence[str] | None = None,
    hf_resolved: dict[str, Any] | None = None,
) -> SequenceModel:
    """Build a model for inputs of ``input_kind`` ("tokens" with ``vocab_size``, or "numeric"
    with ``d_input`` channels, default 1, plus a mask-indicator channel if ``mask_channel``).
    A setting of the other input kind (``d_input`` for tokens, ``vocab_size`` for numeric inputs) or
    a token model without its vocabulary size is a ConfigError, never silently ignored.

    A block name registered with :func:`~longrange.models.registry.register_model` stands for a
    whole model and is built by its function: ``block: hf`` models (:mod:`longrange.models.hf`)
    also take the task's token strings
    ``vocab`` (to map them to a pretrained LM's tokens) and ``hf_resolved`` (their saved
    :meth:`~longrange.models.hf.HFModel.rebuild_info`, to rebuild without the snapshot).
    """
    check_sizes(input_kind, vocab_size, d_input)
    d_input = 1 if d_input is None else d_input
    builder = BLOCKS.get(cfg.block)
    if builds_model(builder):  # a block name that stands for a whole model (block: hf)
        return builder(
            cfg,
            input_kind=input_kind,
            head=head,
            n_out=n_out,
            vocab_size=vocab_size,
            d_input=d_input,
            mask_channel=mask_channel,
            vocab=vocab,
            hf_resolved=hf_resolved,
        )
    check_inputs(input_kind, mask_channel)
    if input_kind == "tokens":
        encoder: nn.Module = TokenEncoder(vocab_size, cfg.d_model, cfg.pos_embedding, cfg.max_len)
    else:
        encoder = NumericEncoder(d_input, cfg.d_model, mask_channel, cfg.pos_embedding, cfg.max_len)
    return SequenceModel(cfg, encoder, head, n_out)


def check_inputs(input_kind: str, mask_channel: bool) -> None:
    """A ConfigError for an unknown input kind, or a mask channel on token inputs."""
    if input_kind not in ("tokens", "numeric"):
        raise ConfigError(f"unknown input kind {input_kind!r}; expected tokens or numeric")
    if input_kind == "tokens" and mask_channel:
        raise ConfigError("token inputs are masked with the mask token, not a mask-indicator channel")


def check_sizes(input_kind: str, vocab_size: int | None, d_input: int | None) -> None:
    """A ConfigError for a token model without its vocabulary size, or a setting of the other input
    kind (``d_input`` on tokens, ``vocab_size`` on numeric inputs), which would be ignored."""
    if input_kind == "tokens":
        if d_input not in (None, 1):
            raise ConfigError(
                f"d_input={d_input} is the channel count of numeric inputs; token inputs "
                "(input_kind='tokens') take vocab_size, the vocabulary's size, instead"
            )
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ConfigError(
                f"token inputs (input_kind='tokens') need vocab_size, the vocabulary's size "
                f"(e.g. len(data.vocab)), got {vocab_size!r}"
            )
    elif vocab_size is not None:
        raise ConfigError(
            f"vocab_size={vocab_size} is for token inputs; numeric inputs (input_kind='numeric') "
            "take d_input, their number of channels"
        )


def _count(params) -> int:
    seen: set[int] = set()
    total = 0
    for p in params:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def state_size(model: SequenceModel, seq_len: int) -> int | None:
    """Elements of recurrent state the model carries per sequence when it generates, after
    ``seq_len`` positions: every block's state (the mixers' states, a Mamba block's convolution
    windows, attention's KV cache at that length). None for a model that does not generate
    (bidirectional, or a wrapped model without a step mode). Counted on the meta device."""
    from longrange.layers.base import state_elements

    if not model.causal:
        return None
    try:
        state = model.backbone.default_state(1, device=torch.device("meta"))
    except (NotImplementedError, RuntimeError, AttributeError):
        return None
    return state_elements(state, seq_len)


def layer_report(model: SequenceModel, seq_len: int | None = None) -> list[dict[str, Any]]:
    """Per layer of the backbone, first to last: ``layer`` (its index), ``name`` (its entry in the
    stack), ``params`` (trainable parameters of the whole block), ``in_primitives`` (those inside its
    sequence primitives) and, with ``seq_len``, ``state`` (the recurrent state it carries per sequence
    at that length; None where the model does not generate). The blocks' ``params`` and the final
    norm's sum to the backbone's parameters."""
    from longrange.layers.base import state_elements

    rows: list[dict[str, Any]] = []
    blocks = getattr(model.backbone, "blocks", None)
    if blocks is None:  # a wrapped model (block "hf") has no blocks of ours
        return rows
    names = getattr(model.backbone, "layer_names", None) or [type(b).__name__ for b in blocks]
    for i, (name, block) in enumerate(zip(names, blocks)):
        row: dict[str, Any] = {
            "layer": i,
            "name": name,
            "params": _count(block.parameters()),
            "in_primitives": _count(p for m in block.mixers for p in m.parameters()),
        }
        if seq_len is not None:
            state = None
            if model.causal:
                try:
                    state = state_elements(block.default_state(1, device=torch.device("meta")), seq_len)
                except (NotImplementedError, RuntimeError, AttributeError):
                    state = None
            row["state"] = state
        rows.append(row)
    return rows


def parameter_report(model: SequenceModel, seq_len: int | None = None) -> dict[str, Any]:
    """Trainable parameters in total and inside the sequence primitives (the thesis' Table 3); with
    ``seq_len``, also ``state``: :func:`state_size` at that length."""
    total = _count(model.parameters())
    inside = _count(p for m in model.backbone.mixers() for p in m.parameters())
    report = {
        "total": total,
        "in_primitives": inside,
        "share": inside / total if total else 0.0,
        "encoder": _count(model.encoder.parameters()),
        "head": _count(model.head.parameters()),
    }
    if seq_len is not None:
        report["state"] = state_size(model, seq_len)
    return report
