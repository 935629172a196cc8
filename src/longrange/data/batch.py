"""The batch format shared by data, models, objectives and training.

A dataset item is a dict with
  ``inputs``   LongTensor (L,) of token ids, or FloatTensor (L, C) of numeric channels;
  ``target``   LongTensor () class index, FloatTensor (T,) regression targets, or LongTensor (L,)
               per-position class indices with :data:`IGNORE_INDEX` at the positions without an
               answer (per-position tasks, e.g. ``mqar``);
  ``inputs2``  (two-sequence tasks only) the second sequence, same kind as ``inputs``.

``collate`` pads a list of items to the longest sequence (padding at the end, with ``pad_id`` for
tokens and 0.0 for numeric inputs; per-position targets with :data:`IGNORE_INDEX`) and returns a
batch dict with
  ``inputs`` (B, L) or (B, L, C); ``lengths`` LongTensor (B,); ``targets`` (B,), (B, T) or (B, L);
  ``inputs2``/``lengths2`` for two-sequence tasks.
The padding mask is always derived from the lengths with :func:`padding_mask`
(:func:`longrange.ops.masks.padding_mask`, re-exported here).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from longrange.errors import DataFormatError
from longrange.ops.masks import padding_mask  # noqa: F401  (part of the batch format's API)

#: Token id of padding. Special tokens take the first ids of every vocabulary.
PAD_ID = 0
#: The per-position target of a position that carries no answer (PyTorch's default ``ignore_index``).
IGNORE_INDEX = -100


def _pad(seqs: Sequence[Tensor], pad_value: float | int) -> tuple[Tensor, Tensor]:
    lengths = torch.tensor([s.shape[0] for s in seqs], dtype=torch.long)
    max_len = int(lengths.max()) if len(seqs) else 0
    first = seqs[0]
    out = first.new_full((len(seqs), max_len, *first.shape[1:]), pad_value)
    for i, s in enumerate(seqs):
        if s.shape[1:] != first.shape[1:]:
            raise ValueError(
                f"item {i} has per-position shape {tuple(s.shape[1:])}, item 0 has {tuple(first.shape[1:])}"
            )
        out[i, : s.shape[0]] = s
    return out, lengths


def collate(items: Sequence[dict], pad_id: int = PAD_ID) -> dict[str, Tensor]:
    """Pad and stack dataset items into a batch (see the module docstring)."""
    if not items:
        raise ValueError("cannot collate an empty list of items")
    batch: dict[str, Tensor] = {}
    for key, len_key in (("inputs", "lengths"), ("inputs2", "lengths2")):
        if key in items[0]:
            seqs = [it[key] for it in items]
            pad_value = pad_id if not seqs[0].is_floating_point() else 0.0
            batch[key], batch[len_key] = _pad(seqs, pad_value)
    if "recalled" in items[0]:  # the input tokens that recall determines (generated recall tasks)
        batch["recalled"] = _pad([it["recalled"] for it in items], False)[0]
    targets = [torch.as_tensor(it["target"]) for it in items]
    if is_position_targets(targets[0]):
        batch["targets"] = _pad(targets, IGNORE_INDEX)[0]
    else:
        batch["targets"] = torch.stack(targets)
    return batch


def is_position_targets(target: Tensor) -> bool:
    """Whether one item's target is per-position class indices (a 1-D integer tensor)."""
    return target.dim() == 1 and not target.is_floating_point()


def check_class_labels(targets: Tensor, n_classes: int, where: str = "the batch") -> None:
    """DataFormatError unless ``targets`` are class indices in [0, n_classes).

    One reduction and one read of its result: on CPU tensors (a batch being collated) this costs
    no device synchronisation.
    """
    if targets.dim() != 1 or targets.is_floating_point():
        raise DataFormatError(
            f"class labels in {where} must be indices of shape (batch,), got {targets.dtype} {tuple(targets.shape)}"
        )
    if not targets.numel():
        return
    low, high = (int(v) for v in torch.aminmax(targets))
    if low < 0 or high >= n_classes:
        raise DataFormatError(f"class label {low if low < 0 else high} in {where} is outside [0, {n_classes})")


def check_position_labels(targets: Tensor, n_classes: int, where: str = "the batch") -> None:
    """DataFormatError unless ``targets`` (batch, length) hold class indices in [0, n_classes) or
    :data:`IGNORE_INDEX`. One reduction, as :func:`check_class_labels`."""
    if targets.dim() != 2 or targets.is_floating_point():
        raise DataFormatError(
            f"per-position labels in {where} must be indices of shape (batch, length), "
            f"got {targets.dtype} {tuple(targets.shape)}"
        )
    answers = targets[targets != IGNORE_INDEX]
    if not answers.numel():
        return
    low, high = (int(v) for v in torch.aminmax(answers))
    if low < 0 or high >= n_classes:
        raise DataFormatError(
            f"per-position label {low if low < 0 else high} in {where} is outside "
            f"[0, {n_classes}) (and is not the ignore index {IGNORE_INDEX})"
        )
