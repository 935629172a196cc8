"""Deterministic batch order: derived from (seed, epoch), never from a loader's random state.

Epoch ``e`` visits the training set in the permutation :func:`epoch_permutation` ``(n, seed, e)``,
cut into global batches of ``batch_size`` items (the incomplete tail is dropped, so every rank and
every micro-batch has the same size and mean losses average exactly). Rank ``r`` of ``world_size``
takes items ``[r * b, (r + 1) * b)`` of each global batch (``b = batch_size / world_size``), and
splits them into ``grad_accum`` consecutive micro-batches.

Because the order is a pure function of (seed, epoch, position), a resumed run skips the global
batches it already consumed and sees exactly the batches the uninterrupted run would have seen,
whatever the number of ranks. :class:`BatchPlan` turns this order into the loaders of a run: the
micro-batches of each optimiser step, from a data position onwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, Subset

from longrange.errors import ConfigError


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order of items ``0..n-1`` in ``epoch`` (a fresh, well-mixed stream per (seed, epoch))."""
    return np.random.default_rng([seed, epoch]).permutation(n)


class ShardedBatchSampler(Sampler[list[int]]):
    """Yields this rank's micro-batches (lists of item indices) of one epoch, from ``start_batch``.

    Args:
        n_items: size of the dataset.
        batch_size: the global batch size of one optimiser step.
        seed, epoch: select the permutation.
        rank, world_size: this process's slice of every global batch.
        grad_accum: micro-batches per rank per global batch.
        start_batch: global batches of this epoch already consumed (skipped).
    """

    def __init__(
        self,
        n_items: int,
        batch_size: int,
        seed: int,
        epoch: int,
        rank: int = 0,
        world_size: int = 1,
        grad_accum: int = 1,
        start_batch: int = 0,
    ):
        if batch_size % (world_size * grad_accum):
            raise ValueError(
                f"global batch {batch_size} is not divisible by world_size {world_size} x grad_accum {grad_accum}"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        self.n_items = n_items
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = epoch
        self.rank = rank
        self.world_size = world_size
        self.grad_accum = grad_accum
        self.start_batch = start_batch

    @property
    def batches_per_epoch(self) -> int:
        return self.n_items // self.batch_size

    def __len__(self) -> int:
        return max(0, self.batches_per_epoch - self.start_batch) * self.grad_accum

    def __iter__(self) -> Iterator[list[int]]:
        order = epoch_permutation(self.n_items, self.seed, self.epoch)
        per_rank = self.batch_size // self.world_size
        micro = per_rank // self.grad_accum
        for b in range(self.start_batch, self.batches_per_epoch):
            lo = b * self.batch_size + self.rank * per_rank
            for m in range(self.grad_accum):
                yield order[lo + m * micro : lo + (m + 1) * micro].tolist()


def eval_shards(n_items: int, batch_size: int, rank: int = 0, world_size: int = 1) -> list[list[int]]:
    """This rank's evaluation batches: a contiguous 1/world_size share of ``0..n-1`` in order.

    Every item is visited exactly once over all ranks; shares may differ by one item, which is
    harmless because evaluation adds up sums rather than averaging means.
    """
    lo, hi = rank * n_items // world_size, (rank + 1) * n_items // world_size
    return [list(range(i, min(i + batch_size, hi))) for i in range(lo, hi, batch_size)]


# ---------------------------------------------------------------------------- loaders
def derived_seed(*parts: int) -> int:
    """A seed derived from integers (a fresh, well-mixed stream per combination)."""
    return int(np.random.default_rng(list(parts)).integers(2**62))


def _seed_worker(worker_id: int) -> None:
    # torch seeds each worker's torch and python generators; numpy needs it done by hand.
    np.random.seed(torch.initial_seed() % 2**32)


def make_loader(
    dataset: Dataset,
    batch_sampler: Any,
    collate: Callable[[Sequence[dict]], dict],
    *,
    num_workers: int = 0,
    pin_memory: bool = False,
    generator_seed: int = 0,
) -> DataLoader:
    """A loader of ``batch_sampler``'s batches. It has a private generator: creating it never draws
    from the global RNG, whose stream belongs to the model (dropout) and continues exactly across a
    resume."""
    return DataLoader(
        dataset,
        batch_sampler=batch_sampler,
        collate_fn=collate,
        num_workers=num_workers,
        pin_memory=pin_memory,
        worker_init_fn=_seed_worker if num_workers else None,
        generator=torch.Generator().manual_seed(generator_seed),
    )


def check_map_style(**splits: Dataset | None) -> None:
    """A ConfigError for a dataset without a length: the batch order needs map-style datasets."""
    for split, ds in splits.items():
        if ds is not None and not hasattr(ds, "__len__"):
            raise ConfigError(
                f"the {split} set ({type(ds).__name__}) has no length: the trainer needs map-style datasets "
                "(with __len__ and __getitem__) to derive a resumable batch order"
            )


class DataPosition(Protocol):
    """Where a run is in its data: ``epoch``, and the global batches ``batches_done`` in it."""

    epoch: int
    batches_done: int
    data_seed: int


class BatchPlan:
    """The training batches of a run: ``steps_per_epoch`` global batches of ``batch_size`` items per
    epoch, each split over ``world_size`` ranks and ``grad_accum`` micro-batches."""

    def __init__(
        self,
        train_set: Dataset,
        collate: Callable[[Sequence[dict]], dict],
        *,
        batch_size: int,
        grad_accum: int = 1,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 0,
        pin_memory: bool = False,
    ):
        self.train_set, self.collate = train_set, collate
        self.batch_size, self.grad_accum = batch_size, grad_accum
        self.rank, self.world_size = rank, world_size
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.steps_per_epoch = len(train_set) // batch_size
        if self.steps_per_epoch == 0:
            why = "no complete batch; lower train.batch_size"
            if isinstance(train_set, Subset):  # task.train_subset kept part of the training set
                why = (
                    f"task.train_subset kept {len(train_set)} of its {len(train_set.dataset)} items; raise "
                    "task.train_subset (null keeps them all) or lower train.batch_size"
                )
            raise ConfigError(
                f"train.batch_size {batch_size} is larger than the training set ({len(train_set)} items): {why}"
            )

    def loader(self, dataset: Dataset, batch_sampler: Any, generator_seed: int) -> DataLoader:
        return make_loader(
            dataset,
            batch_sampler,
            self.collate,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            generator_seed=generator_seed,
        )

    def steps(self, position: DataPosition) -> Iterator[list[dict[str, Any]]]:
        """The micro-batches of each optimiser step from ``position`` onwards, without end. The caller
        counts ``position.batches_done`` up after each step; a new epoch starts here."""
        while True:
            if position.batches_done >= self.steps_per_epoch:
                position.epoch += 1
                position.batches_done = 0
            if hasattr(self.train_set, "set_epoch"):
                self.train_set.set_epoch(position.epoch)
            sampler = ShardedBatchSampler(
                len(self.train_set),
                self.batch_size,
                position.data_seed,
                position.epoch,
                rank=self.rank,
                world_size=self.world_size,
                grad_accum=self.grad_accum,
                start_batch=position.batches_done,
            )
            seed = derived_seed(position.data_seed, position.epoch, position.batches_done, self.rank)
            group: list[dict[str, Any]] = []
            for batch in self.loader(self.train_set, sampler, seed):
                group.append(batch)
                if len(group) == self.grad_accum:
                    yield group
                    group = []
