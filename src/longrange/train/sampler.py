"""Deterministic batch order: derived from (seed, epoch), never from a loader's random state.

Epoch ``e`` visits the training set in the permutation :func:`epoch_permutation` ``(n, seed, e)``,
cut into global batches of ``batch_size`` items (the incomplete tail is dropped, so every rank and
every micro-batch has the same size and mean losses average exactly). Rank ``r`` of ``world_size``
takes items ``[r * b, (r + 1) * b)`` of each global batch (``b = batch_size / world_size``), and
splits them into ``grad_accum`` consecutive micro-batches.

Because the order is a pure function of (seed, epoch, position), a resumed run skips the global
batches it already consumed and sees exactly the batches the uninterrupted run would have seen,
whatever the number of ranks.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
from torch.utils.data import Sampler


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
                yield order[lo + m * micro: lo + (m + 1) * micro].tolist()


def eval_shards(n_items: int, batch_size: int, rank: int = 0, world_size: int = 1) -> list[list[int]]:
    """This rank's evaluation batches: a contiguous 1/world_size share of ``0..n-1`` in order.

    Every item is visited exactly once over all ranks; shares may differ by one item, which is
    harmless because evaluation adds up sums rather than averaging means.
    """
    lo, hi = rank * n_items // world_size, (rank + 1) * n_items // world_size
    return [list(range(i, min(i + batch_size, hi))) for i in range(lo, hi, batch_size)]
