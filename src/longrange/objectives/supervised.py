"""Supervised training and finetuning: the task's own loss and metric (accuracy, or R² for regression).

Per-position tasks (``TaskSpec.per_position``) answer at chosen positions: :class:`PositionClassification`
takes the loss at those positions only and reports accuracy over the answers and over whole sequences.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longrange.data.batch import IGNORE_INDEX, check_class_labels, check_position_labels
from longrange.errors import ConfigError
from longrange.objectives.base import StepOutput, register_objective
from longrange.ops.dataless import holds_data


def model_outputs(model: nn.Module, batch: Mapping[str, Tensor], inputs: Tensor | None = None) -> Tensor:
    """Call the model on a batch (one or two sequences)."""
    return model(
        batch["inputs"] if inputs is None else inputs,
        batch.get("lengths"),
        batch.get("inputs2"),
        batch.get("lengths2"),
    )


def _f64(x: Tensor) -> Tensor:
    return x.detach().to(torch.float64)


@register_objective("classification")
class Classification:
    """Cross-entropy; metric accuracy.

    The label range is checked on the first batch only: a per-step check would wait for the device
    at every step. Batches of a task's data are checked when they are collated
    (:meth:`longrange.data.TaskData.collate`).
    """

    metric = "accuracy"
    higher_is_better = True

    def __init__(self) -> None:
        self._labels_checked = False

    def __call__(self, model: nn.Module, batch: Mapping[str, Tensor]) -> StepOutput:
        logits = model_outputs(model, batch)
        targets = batch["targets"]
        if targets.dim() != 1 or targets.is_floating_point():
            raise ValueError(
                f"classification targets must be class indices of shape (batch,), got {targets.dtype} {tuple(targets.shape)}"
            )
        if not self._labels_checked and holds_data(targets):  # labels without data (dry runs): nothing to check
            check_class_labels(targets, logits.shape[-1], "the first batch")
            self._labels_checked = True
        targets = targets.to(logits.device)
        loss = F.cross_entropy(logits.float(), targets, reduction="sum")
        n = targets.numel()
        sums = {
            "loss_sum": _f64(loss),
            "count": torch.tensor(float(n), dtype=torch.float64),
            "correct": _f64((logits.argmax(-1) == targets).sum()),
        }
        return StepOutput(loss / n, sums)

    def summarize(self, sums: Mapping[str, Tensor]) -> dict[str, float]:
        n = float(sums["count"])
        return {"loss": float(sums["loss_sum"]) / n, "accuracy": float(sums["correct"]) / n}


@register_objective("regression")
class Regression:
    """Mean squared error on standardised targets; metric R² (the mean over targets)."""

    metric = "r2"
    higher_is_better = True

    def __call__(self, model: nn.Module, batch: Mapping[str, Tensor]) -> StepOutput:
        pred = model_outputs(model, batch).float()
        targets = batch["targets"].to(pred.device).float()
        if targets.dim() == 1:
            targets = targets.unsqueeze(-1)
        if targets.shape != pred.shape:
            raise ValueError(
                f"regression targets of shape {tuple(targets.shape)} do not match predictions {tuple(pred.shape)}"
            )
        sq = (pred - targets).pow(2)
        loss = sq.mean()
        t64 = _f64(targets)
        sums = {
            "loss_sum": _f64(sq.sum()),
            "count": torch.tensor(float(targets.numel()), dtype=torch.float64),
            "n": torch.tensor(float(targets.shape[0]), dtype=torch.float64),
            # per-target sums for R² = 1 - SSE / SST
            "sse": _f64(sq.sum(0)),
            "y_sum": t64.sum(0),
            "y_sq_sum": t64.pow(2).sum(0),
        }
        return StepOutput(loss, sums)

    def summarize(self, sums: Mapping[str, Tensor]) -> dict[str, float]:
        n = sums["n"]
        sst = sums["y_sq_sum"] - sums["y_sum"].pow(2) / n
        r2 = 1.0 - sums["sse"] / sst.clamp_min(1e-12)
        return {"loss": float(sums["loss_sum"] / sums["count"]), "r2": float(r2.mean())}


def position_logits_reference(model: nn.Module, batch: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
    """The slow path of :class:`PositionClassification`: the head at every position, then the rows
    of the answer positions. Returns (logits (answers, n_out), answers' targets)."""
    targets = batch["targets"]
    logits = model(batch["inputs"], batch.get("lengths"))
    where = (targets != IGNORE_INDEX).to(logits.device)
    return logits[where], targets.to(logits.device)[where]


@register_objective("positions")
class PositionClassification:
    """Cross-entropy at the positions that ask an answer; metrics over answers and whole sequences.

    ``batch["targets"]`` (batch, length) holds class indices at the answer positions and
    :data:`~longrange.data.batch.IGNORE_INDEX` elsewhere. The loss is the mean over answers; the
    metrics are ``accuracy`` (answers right over answers) and ``sequence_accuracy`` (sequences with
    every answer right over sequences with at least one answer). The model applies its
    per-position head at the answer positions only (``model(..., positions=mask)``); ``fast=False``
    applies it everywhere and selects afterwards (:func:`position_logits_reference`).

    ``causal``: the answers are next-token predictions (the task's ``TaskSpec.causal``); a model
    that sees the future is refused.
    """

    metric = "accuracy"
    higher_is_better = True

    def __init__(self, causal: bool = False, fast: bool = True) -> None:
        self.causal, self.fast = causal, fast
        self._labels_checked = False

    def __call__(self, model: nn.Module, batch: Mapping[str, Tensor]) -> StepOutput:
        if self.causal and not getattr(model, "causal", True):
            raise ConfigError(
                "this task's answers are next-token predictions: it needs a causal model (model.direction = 'causal')"
            )
        targets = batch["targets"]
        if targets.dim() != 2 or targets.is_floating_point():
            raise ValueError(
                f"per-position targets must be class indices of shape (batch, length), got "
                f"{targets.dtype} {tuple(targets.shape)}"
            )
        where = targets != IGNORE_INDEX
        if self.fast:
            logits = model(batch["inputs"], batch.get("lengths"), positions=where)
            answers = targets[where].to(logits.device)
        else:
            logits, answers = position_logits_reference(model, batch)
        if not self._labels_checked and holds_data(targets):
            check_position_labels(targets, logits.shape[-1], "the first batch")
            self._labels_checked = True
        n = answers.numel()
        loss_sum = F.cross_entropy(logits.float(), answers, reduction="sum")
        right = logits.argmax(-1) == answers
        # a sequence is right when none of its answers is wrong (sequences without answers do not count)
        wrong = torch.zeros(where.shape, dtype=torch.bool, device=right.device)
        wrong[where.to(right.device)] = ~right
        asks = where.any(1).to(right.device)
        sums = {
            "loss_sum": _f64(loss_sum),
            "count": torch.tensor(float(n), dtype=torch.float64),
            "correct": _f64(right.sum()),
            "sequences": _f64(asks.sum()),
            "sequences_correct": _f64((asks & ~wrong.any(1)).sum()),
        }
        return StepOutput(loss_sum / max(n, 1), sums)

    def summarize(self, sums: Mapping[str, Tensor]) -> dict[str, float]:
        n, seqs = max(float(sums["count"]), 1.0), max(float(sums["sequences"]), 1.0)
        return {
            "loss": float(sums["loss_sum"]) / n,
            "accuracy": float(sums["correct"]) / n,
            "sequence_accuracy": float(sums["sequences_correct"]) / seqs,
        }
