"""Self-pretraining objectives on the task's own inputs: next-token (causal) and masked prediction.

Token inputs predict token ids (cross-entropy). Numeric inputs predict values with an L1 loss, or
with a ``levels``-way classification of the quantised value per channel (the SPT paper's 256-way
intensity classification), which needs the value range that the levels span.

Two-sequence tasks (retrieval) are pretrained on each document as its own sequence.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longrange.data.tokenize import FIRST_TOKEN_ID, MASK_ID
from longrange.errors import ConfigError
from longrange.objectives.base import StepOutput, register_objective
from longrange.ops.masks import padding_mask

NUMERIC_LOSSES = ("l1", "classes")


def single_sequences(batch: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Inputs and lengths of a batch, with the second sequences of a two-sequence batch appended as rows."""
    inputs, lengths = batch["inputs"], batch["lengths"]
    if "inputs2" not in batch:
        return inputs, lengths
    a, b = inputs, batch["inputs2"]
    length = max(a.shape[1], b.shape[1])
    pad = lambda x: F.pad(x, (0, 0) * (x.dim() - 2) + (0, length - x.shape[1]))  # noqa: E731
    return torch.cat([pad(a), pad(b)]), torch.cat([lengths, batch["lengths2"]])


def reverse_valid(x: Tensor, lengths: Tensor) -> Tensor:
    """Reverse each sequence of x (batch, length, ...) within its real length; padding stays at the end."""
    positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
    lengths = lengths.to(x.device).unsqueeze(1)
    index = torch.where(positions < lengths, lengths - 1 - positions, positions)
    if x.dim() > 2:
        index = index.reshape(*index.shape, *([1] * (x.dim() - 2))).expand_as(x)
    return x.gather(1, index)


class _ValueTargets:
    """Loss and statistics of predictions against targets at selected positions."""

    def __init__(self, input_kind: str, numeric_loss: str, levels: int, value_range: tuple[float, float] | None):
        if input_kind not in ("tokens", "numeric"):
            raise ConfigError(f"unknown input kind {input_kind!r}")
        if numeric_loss not in NUMERIC_LOSSES:
            raise ConfigError(f"objective.numeric_loss = {numeric_loss!r} is not one of {', '.join(NUMERIC_LOSSES)}")
        if input_kind == "numeric" and numeric_loss == "classes":
            if value_range is None or len(value_range) != 2 or not value_range[0] < value_range[1]:
                raise ConfigError(
                    "objective.numeric_loss = 'classes' needs objective.value_range = [low, high], the values that "
                    f"levels 0 and {levels - 1} stand for, got {value_range!r}"
                )
        self.input_kind = input_kind
        self.numeric_loss = numeric_loss
        self.levels = levels
        self.value_range = value_range

    def head_size(self, vocab_size: int | None, d_input: int) -> int:
        """Output size of the token head this objective needs."""
        if self.input_kind == "tokens":
            if not vocab_size:
                raise ConfigError("a token objective needs the vocabulary size")
            return vocab_size
        return d_input * (self.levels if self.numeric_loss == "classes" else 1)

    def quantise(self, values: Tensor) -> Tensor:
        low, high = self.value_range
        scaled = (values.float() - low) / (high - low) * (self.levels - 1)
        return scaled.round().clamp(0, self.levels - 1).long()

    def loss(self, pred: Tensor, target: Tensor, where: Tensor) -> StepOutput:
        """pred (B, L, n_out), target (B, L) ids or (B, L, C) values, where (B, L) bool."""
        pred, target = pred[where].float(), target[where]
        n = target.shape[0]
        if n == 0:
            zero = pred.sum() * 0.0
            return StepOutput(
                zero, {"loss_sum": torch.zeros((), dtype=torch.float64), "count": torch.zeros((), dtype=torch.float64)}
            )
        if self.input_kind == "tokens":
            loss_sum = F.cross_entropy(pred, target, reduction="sum")
            correct = (pred.argmax(-1) == target).sum()
        elif self.numeric_loss == "l1":
            loss_sum = (pred - target.float()).abs().mean(-1).sum()
            correct = None
        else:
            channels = target.shape[-1]
            logits = pred.reshape(n * channels, self.levels)
            classes = self.quantise(target).reshape(-1)
            loss_sum = F.cross_entropy(logits, classes, reduction="sum") / channels
            correct = (logits.argmax(-1) == classes).float().sum() / channels
        sums = {"loss_sum": loss_sum.detach().double(), "count": torch.tensor(float(n), dtype=torch.float64)}
        if correct is not None:
            sums["correct"] = correct.detach().double()
        return StepOutput(loss_sum / n, sums)


def _summarize(sums: Mapping[str, Tensor]) -> dict[str, float]:
    n = max(float(sums["count"]), 1.0)
    out = {"loss": float(sums["loss_sum"]) / n}
    if "correct" in sums:
        out["accuracy"] = float(sums["correct"]) / n
    if "recall_count" in sums and float(sums["recall_count"]) > 0:
        out["recall_accuracy"] = float(sums["recall_correct"]) / float(sums["recall_count"])
    return out


def with_recall(
    out: StepOutput, pred: Tensor, target: Tensor, where: Tensor, batch: Mapping[str, Tensor], shift: int
) -> StepOutput:
    """``out`` with the prediction's accuracy at the recall events of the inputs (``batch["recalled"]``,
    generated recall tasks): the input tokens that recall determines among those predicted (``where``);
    ``shift`` 1 for next-token targets (the token at t + 1 predicted at t)."""
    recalled = batch.get("recalled")
    if recalled is None or pred.shape[-1] <= 1 or target.dtype.is_floating_point:
        return out
    at = recalled[:, shift:].to(where.device) & where
    correct = (pred[at].argmax(-1) == target[at]).sum().detach().double()
    out.sums["recall_correct"] = correct
    out.sums["recall_count"] = at.sum().detach().double()
    return out


@register_objective("causal")
class NextTokenPrediction:
    """Causal pretraining: predict position t+1 from positions ≤ t (targets = inputs shifted by one).

    ``reverse=True`` trains on each sequence reversed (the R1 model of F1R1 pretraining).
    """

    metric = "loss"
    higher_is_better = False

    def __init__(
        self,
        input_kind: str,
        numeric_loss: str = "l1",
        levels: int = 256,
        value_range: tuple[float, float] | None = None,
        reverse: bool = False,
    ):
        self.targets = _ValueTargets(input_kind, numeric_loss, levels, value_range)
        self.reverse = reverse

    def head_size(self, vocab_size: int | None, d_input: int) -> int:
        return self.targets.head_size(vocab_size, d_input)

    def __call__(self, model: nn.Module, batch: Mapping[str, Tensor]) -> StepOutput:
        if not getattr(model, "causal", True):
            raise ConfigError("next-token pretraining needs a causal model (model.direction = 'causal')")
        inputs, lengths = single_sequences(batch)
        if self.reverse:
            inputs = reverse_valid(inputs, lengths)
        pred = model(inputs, lengths)
        where = padding_mask(lengths.to(pred.device), inputs.shape[1])[:, 1:]
        target = inputs[:, 1:].to(pred.device)
        out = self.targets.loss(pred[:, :-1], target, where)
        return with_recall(out, pred[:, :-1], target, where, {} if self.reverse else batch, shift=1)

    summarize = staticmethod(_summarize)


@register_objective("masked")
class MaskedPrediction:
    """Masked pretraining: predict the inputs at masked positions only.

    A fraction ``ratio`` of each sequence's real positions is masked (at least one), in spans of
    ``span`` positions. Token inputs take the mask token (or, with ``bert``, the mask token 80%
    of the time, a random task token 10%, the original 10%). Numeric inputs are zeroed and a
    mask-indicator channel (1 at masked positions) is appended, so the model's encoder must
    have been built with ``mask_channel=True``.
    """

    metric = "loss"
    higher_is_better = False

    def __init__(
        self,
        input_kind: str,
        ratio: float,
        *,
        mask_id: int = MASK_ID,
        first_token_id: int = FIRST_TOKEN_ID,
        vocab_size: int | None = None,
        bert: bool = False,
        span: int = 1,
        numeric_loss: str = "l1",
        levels: int = 256,
        value_range: tuple[float, float] | None = None,
    ):
        if not 0.0 < ratio < 1.0:
            raise ConfigError(f"objective.mask_ratio must be in (0, 1), got {ratio}")
        if span < 1:
            raise ConfigError(f"objective.span must be at least 1, got {span}")
        if bert and input_kind == "tokens" and not vocab_size:
            raise ConfigError("BERT-style replacement needs the vocabulary size")
        self.targets = _ValueTargets(input_kind, numeric_loss, levels, value_range)
        self.input_kind = input_kind
        self.ratio = ratio
        self.mask_id = mask_id
        self.first_token_id = first_token_id
        self.vocab_size = vocab_size
        self.bert = bert
        self.span = span

    def head_size(self, vocab_size: int | None, d_input: int) -> int:
        return self.targets.head_size(vocab_size, d_input)

    def choose(self, lengths: Tensor, max_len: int, generator: torch.Generator | None = None) -> Tensor:
        """Boolean (batch, max_len) masked positions: ≈ ratio·length per sequence (≥ 1), in spans."""
        device = lengths.device
        valid = padding_mask(lengths, max_len)
        n_spans = (lengths.float() * self.ratio / self.span).round().clamp_min(1).long()
        # Random span starts: the n_spans smallest random scores among each row's valid starts.
        scores = torch.rand(lengths.shape[0], max_len, generator=generator, device=device)
        scores = scores.masked_fill(~valid, 2.0)
        ranks = scores.argsort(1).argsort(1)
        starts = (ranks < n_spans.unsqueeze(1)) & valid
        chosen = starts.clone()
        for offset in range(1, self.span):
            chosen[:, offset:] |= starts[:, :-offset]
        return chosen & valid

    def corrupt(self, inputs: Tensor, chosen: Tensor, generator: torch.Generator | None = None) -> Tensor:
        if self.input_kind == "numeric":
            values = inputs.masked_fill(chosen.unsqueeze(-1), 0.0)
            return torch.cat([values, chosen.unsqueeze(-1).to(values.dtype)], dim=-1)
        corrupted = inputs.masked_fill(chosen, self.mask_id)
        if self.bert:
            u = torch.rand(chosen.shape, generator=generator, device=inputs.device)
            random_ids = torch.randint(
                self.first_token_id, self.vocab_size, chosen.shape, generator=generator, device=inputs.device
            )
            corrupted = torch.where(chosen & (u >= 0.8) & (u < 0.9), random_ids, corrupted)
            corrupted = torch.where(chosen & (u >= 0.9), inputs, corrupted)
        return corrupted

    def __call__(self, model: nn.Module, batch: Mapping[str, Tensor]) -> StepOutput:
        inputs, lengths = single_sequences(batch)
        chosen = self.choose(lengths, inputs.shape[1])
        pred = model(self.corrupt(inputs, chosen), lengths)
        target, where = inputs.to(pred.device), chosen.to(pred.device)
        return with_recall(self.targets.loss(pred, target, where), pred, target, where, batch, shift=0)

    summarize = staticmethod(_summarize)
