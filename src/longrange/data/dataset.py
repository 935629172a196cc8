"""The data of a task in memory: :class:`SequenceDataset` (one split: a sequence and a target per
item), :class:`TaskData` (a loaded task: its spec, three splits and vocabulary), the dataset of a
split stored packed (:func:`unpack_split`), and the deterministic training subsets of data-scarcity
experiments (:func:`subset_indices`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from longrange.data.batch import PAD_ID, check_class_labels, check_position_labels, collate
from longrange.data.packing import unpack
from longrange.data.spec import TaskSpec
from longrange.data.tokenize import Vocabulary
from longrange.errors import ConfigError


class SequenceDataset(Dataset):
    """Items ``{"inputs": Tensor, "target": Tensor[, "inputs2": Tensor]}`` (see ``data/batch.py``).

    Args:
        inputs: one tensor per sample, (L,) token ids or (L, C) numeric channels.
        targets: (N,) class indices or (N, T) regression targets.
        inputs2: the second sequence of two-sequence tasks, one tensor per sample.
    """

    def __init__(self, inputs: Sequence[Tensor], targets: Tensor, inputs2: Sequence[Tensor] | None = None):
        if len(inputs) != len(targets):
            raise ValueError(f"{len(inputs)} inputs but {len(targets)} targets")
        if inputs2 is not None and len(inputs2) != len(inputs):
            raise ValueError(f"{len(inputs)} inputs but {len(inputs2)} second inputs")
        self.inputs = list(inputs)
        self.targets = targets
        self.inputs2 = None if inputs2 is None else list(inputs2)

    @classmethod
    def from_packed(
        cls, flat: Tensor, offsets: Tensor, targets: Tensor, flat2: Tensor | None = None, offsets2: Tensor | None = None
    ) -> SequenceDataset:
        """Build from :func:`~longrange.data.packing.pack`-ed sequences (items are views into ``flat``)."""
        inputs2 = None if flat2 is None else unpack(flat2, offsets2)
        return cls(unpack(flat, offsets), targets, inputs2)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, idx: int) -> dict[str, Tensor]:
        item = {"inputs": _as_long(self.inputs[idx]), "target": self.targets[idx]}
        if self.inputs2 is not None:
            item["inputs2"] = _as_long(self.inputs2[idx])
        return item


_COMPACT_INTS = (torch.uint8, torch.int8, torch.int16, torch.int32)


def _as_long(x: Tensor) -> Tensor:
    """Token ids may be stored compactly (e.g. int16); items always carry LongTensors."""
    return x.long() if x.dtype in _COMPACT_INTS else x


def unpack_split(prepared: dict, split: str) -> SequenceDataset:
    """The dataset of one split stored by :func:`~longrange.data.packing.pack_split`."""
    return SequenceDataset.from_packed(
        prepared[f"{split}_flat"],
        prepared[f"{split}_offsets"],
        prepared[f"{split}_targets"],
        prepared.get(f"{split}_flat2"),
        prepared.get(f"{split}_offsets2"),
    )


@dataclass
class TaskData:
    """A loaded task: its spec, the three splits, and the vocabulary of token tasks."""

    spec: TaskSpec
    train: Dataset
    val: Dataset
    test: Dataset
    vocab: Vocabulary | None = None
    #: Bad records skipped with ``skip_bad=True``, per source file.
    skipped: dict[str, int] = field(default_factory=dict)
    #: Free-form facts about the loaded data (e.g. which source, split sizes before subsetting).
    info: dict[str, Any] = field(default_factory=dict)

    def collate(self, items: Sequence[dict]) -> dict[str, Tensor]:
        """Pad items into a batch with the vocabulary's pad id (see ``data/batch.py``); class labels
        outside [0, n_classes) are a DataFormatError (checked here, on the CPU, once per batch)."""
        batch = collate(items, pad_id=self.vocab.pad_id if self.vocab is not None else PAD_ID)
        where = f"a batch of task {self.spec.name}"
        if self.spec.per_position:
            check_position_labels(batch["targets"], self.spec.n_classes, where)
        elif self.spec.n_classes > 0:
            check_class_labels(batch["targets"], self.spec.n_classes, where)
        return batch

    @property
    def vocab_size(self) -> int | None:
        return None if self.vocab is None else len(self.vocab)


def subset_indices(n: int, subset: float | int, seed: int) -> list[int]:
    """Sorted indices of a deterministic random subset of ``range(n)``.

    ``subset`` is a fraction in (0, 1] (rounded, at least one item) or a count in [1, n]. The subset
    is a prefix of a seeded permutation, so for one seed smaller subsets are contained in larger ones.
    """
    if isinstance(subset, bool) or not isinstance(subset, (int, float)):
        raise ConfigError(f"train_subset must be a fraction in (0, 1] or a count, got {subset!r}")
    if isinstance(subset, float):
        if not 0.0 < subset <= 1.0:
            raise ConfigError(f"train_subset fraction must be in (0, 1], got {subset}")
        count = max(1, round(subset * n))
    else:
        if not 1 <= subset <= n:
            raise ConfigError(f"train_subset count must be in [1, {n}] (the training set size), got {subset}")
        count = subset
    gen = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(n, generator=gen)[:count]
    return sorted(perm.tolist())
