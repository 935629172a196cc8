"""The objective of a stage, built from its kind (supervised, causal, masked) and the task's data.

    objective, token_head = make_objective("masked", data, ObjectiveConfig(mask_ratio=0.15))

``token_head`` is the size of the per-position head the objective needs (None for supervised
objectives, whose head follows the task: :func:`supervised_head`). The supervised objective follows
the task too: classification, regression, or for per-position tasks (``TaskSpec.per_position``:
``selective-copying``, ``induction-heads``, ``mqar``) :class:`~longrange.objectives.supervised.PositionClassification`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from longrange.data.tokenize import MASK_ID
from longrange.errors import ConfigError

#: The objectives of a stage: supervised (train, finetune) and the self-pretraining ones.
KINDS = ("supervised", "causal", "masked")
SPT_KINDS = ("causal", "masked")


@dataclass
class ObjectiveConfig:
    """Options of the pretraining objectives (the kind is chosen per stage)."""

    #: Masking ratio for masked SPT; None takes the task's default (0.5 visual, 0.15 text, 0.1 ListOps).
    mask_ratio: float | None = None
    #: BERT-style replacement of masked tokens (80% mask, 10% random, 10% unchanged).
    bert: bool = False
    #: Masked spans of this many positions.
    span: int = 1
    #: Numeric inputs: "l1" regression of the values, or "classes" (``levels``-way classification).
    numeric_loss: str = "l1"
    #: The number of classes of numeric_loss "classes".
    levels: int = 256
    #: The values that levels 0 and levels-1 stand for, for numeric_loss "classes".
    value_range: list[float] | None = None


def natural_objective(direction: str) -> str:
    """The SPT objective of a model by its direction: causal for causal models, masked for
    bidirectional ones (the SPT paper's choice)."""
    return "masked" if direction == "bidirectional" else "causal"


def supervised_head(spec) -> tuple[str, int]:
    """The head kind and output size of a task's supervised objective (per-position tasks: a
    token head over the answers' classes)."""
    if getattr(spec, "per_position", False):
        return getattr(spec, "head", None) or "tokens", spec.n_classes
    if spec.two_sequences:
        return "retrieval", spec.n_classes
    if spec.n_classes == 0:
        return "regress", spec.n_targets
    return "classify", spec.n_classes


def make_objective(kind: str, data: Any, options: ObjectiveConfig, reverse: bool = False):
    """The objective of a stage and the token-head size it needs (None for supervised heads)."""
    from longrange.objectives.pretraining import MaskedPrediction, NextTokenPrediction
    from longrange.objectives.supervised import Classification, PositionClassification, Regression

    spec = data.spec
    if kind == "supervised":
        if reverse:
            raise ConfigError("reverse sequences are a pretraining option (objective causal)")
        if getattr(spec, "per_position", False):
            return PositionClassification(causal=spec.causal), None
        return (Regression() if spec.n_classes == 0 else Classification()), None
    value_range = tuple(options.value_range) if options.value_range is not None else None
    if kind == "causal":
        objective = NextTokenPrediction(
            spec.input_kind, options.numeric_loss, options.levels, value_range, reverse=reverse
        )
    elif kind == "masked":
        if reverse:
            raise ConfigError("reverse sequences are an option of causal pretraining (for F1R1)")
        vocab = data.vocab
        objective = MaskedPrediction(
            spec.input_kind,
            options.mask_ratio if options.mask_ratio is not None else spec.mask_ratio,
            mask_id=vocab.mask_id if vocab is not None else MASK_ID,
            vocab_size=data.vocab_size,
            bert=options.bert,
            span=options.span,
            numeric_loss=options.numeric_loss,
            levels=options.levels,
            value_range=value_range,
        )
    else:
        raise ConfigError(f"unknown objective {kind!r}; expected {', '.join(KINDS)}")
    return objective, objective.head_size(data.vocab_size, spec.d_input)
