"""Pretrained weights: moving a pretrained encoder and backbone into a finetuning model (morphing
F1 / F1R1 when the directions differ). A run's model is rebuilt by ``train/trained.py``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from longrange.errors import CheckpointError, ConfigError
from longrange.models.config import ModelConfig
from longrange.models.model import SequenceModel
from longrange.models.morph import morph_f1, morph_f1r1
from longrange.train.trained import load_model


def prepare_source(
    source: SequenceModel, target: SequenceModel, reverse: SequenceModel | None
) -> tuple[SequenceModel, str | None]:
    """Make a pretrained model structurally fit the finetuning model: drop the mask channel, morph."""
    for model in (source, reverse):
        if model is not None and hasattr(model.encoder, "drop_mask_channel"):
            model.encoder.drop_mask_channel()
    if reverse is not None:
        if target.cfg.direction != "bidirectional":
            raise ConfigError(
                "F1R1 (a reverse-pretrained model) initialises a bidirectional model: set model.direction=bidirectional"
            )
        return morph_f1r1(source, reverse), "f1r1"
    if source.cfg.direction == "causal" and target.cfg.direction == "bidirectional":
        if source.cfg.block != "mamba" or source.cfg.layers:
            raise ConfigError(
                f"a causally pretrained {source.cfg.name} model cannot initialise a bidirectional one "
                "(its reverse parameters were never trained); pretrain with objective masked"
            )
        return morph_f1(source), "f1"
    return source, None


def _config_differences(a: ModelConfig, b: ModelConfig) -> dict[str, tuple[Any, Any]]:
    # may change between pretraining and finetuning (the head is not transferred)
    free = {"dropout", "pooling", "direction", "head_layers", "head_hidden", "head_activation"}
    da, db = a.to_dict(), b.to_dict()
    return {k: (da[k], db[k]) for k in da if k not in free and da[k] != db[k]}


def transfer_pretrained(target: SequenceModel, source: SequenceModel) -> dict[str, Any]:
    """Copy the encoder and backbone of ``source`` into ``target`` (the head stays fresh).

    Every backbone and encoder tensor of the target must come from the source: a missing tensor or
    a shape mismatch is an error naming it. Returns what was and was not transferred.
    """
    diff = _config_differences(source.cfg, target.cfg)
    if diff:
        raise ConfigError(f"the pretrained model differs from the finetuning model in {diff} (pretrained, finetuning)")
    src, tgt = source.state_dict(), target.state_dict()
    body = [k for k in tgt if k.startswith(("encoder.", "backbone."))]
    missing = [k for k in body if k not in src]
    shapes = [
        f"{k}: pretrained {tuple(src[k].shape)} vs model {tuple(tgt[k].shape)}"
        for k in body
        if k in src and src[k].shape != tgt[k].shape
    ]
    if missing or shapes:
        raise CheckpointError(
            "the pretrained weights do not cover the model's encoder and backbone: "
            + "; ".join(
                filter(None, [f"missing {missing}" if missing else "", f"shape mismatches {shapes}" if shapes else ""])
            )
        )
    target.load_state_dict({**tgt, **{k: src[k] for k in body}})
    return {
        "transferred": len(body),
        "not_transferred": sorted(k for k in src if k not in body),
        "newly_initialised": sorted(k for k in tgt if k not in body),
    }


def load_pretrained(model: SequenceModel, init_from: Path, reverse_from: Path | None = None) -> dict[str, Any]:
    """Load the pretrained run ``init_from`` (and the reverse-pretrained ``reverse_from``, F1R1) into
    ``model``'s encoder and backbone, morphing when needed; says what was transferred."""
    source = load_model(init_from)
    reverse_model = load_model(reverse_from) if reverse_from is not None else None
    source, morph = prepare_source(source, model, reverse_model)
    transfer = {**transfer_pretrained(model, source), "morph": morph}
    print(
        f"finetune: {transfer['transferred']} tensors from {init_from}"
        + (f" (morphed {morph.upper()})" if morph else "")
        + f"; not transferred: {', '.join(transfer['not_transferred']) or 'none'}"
        + f"; newly initialised: {', '.join(transfer['newly_initialised']) or 'none'}",
        file=sys.stderr,
    )
    return transfer
