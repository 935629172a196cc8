"""Packed storage of variable-length sequences: one flat tensor and its offsets, the form the cache
of prepared data stores (one flat tensor saves and loads far faster than many small ones).

    flat, offsets = pack([[1, 2, 3], [4]])     # flat [1, 2, 3, 4], offsets [0, 3, 4]
    unpack(flat, offsets)                      # [tensor([1, 2, 3]), tensor([4])]

A cache entry holds each split under ``{split}_flat``/``{split}_offsets``/``{split}_targets``
(:func:`pack_split`); :func:`longrange.data.dataset.unpack_split` reads one back as a dataset.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def id_dtype(vocab_size: int) -> torch.dtype:
    """The smallest integer dtype that stores ids below ``vocab_size`` (for compact storage)."""
    return torch.int16 if vocab_size <= 2**15 else torch.int32


def pack(seqs: Sequence[Tensor] | Sequence[Sequence[int]], dtype: torch.dtype = torch.long) -> tuple[Tensor, Tensor]:
    """Concatenate variable-length sequences into (flat, offsets) with offsets of shape (N + 1,).

    One flat tensor saves and loads far faster than many small ones (cache entries).
    """
    tensors = [s.to(dtype) if isinstance(s, Tensor) else torch.as_tensor(s, dtype=dtype) for s in seqs]
    lengths = torch.tensor([t.shape[0] for t in tensors], dtype=torch.long)
    offsets = torch.zeros(len(tensors) + 1, dtype=torch.long)
    torch.cumsum(lengths, 0, out=offsets[1:])
    flat = torch.cat(tensors) if tensors else torch.zeros(0, dtype=dtype)
    return flat, offsets


def unpack(flat: Tensor, offsets: Tensor) -> list[Tensor]:
    """Inverse of :func:`pack`: views into ``flat``."""
    bounds = offsets.tolist()
    return [flat[bounds[i] : bounds[i + 1]] for i in range(len(bounds) - 1)]


def pack_split(
    out: dict, split: str, seqs: Sequence, labels: Sequence[int], vocab_size: int, seqs2: Sequence | None = None
) -> None:
    """Store one split of token sequences and class labels in a cache entry ``out``: keys
    ``{split}_flat``, ``{split}_offsets`` (:func:`pack`, ids stored compactly), ``{split}_targets``,
    and ``{split}_flat2``, ``{split}_offsets2`` for the second sequences of two-sequence tasks."""
    out[f"{split}_flat"], out[f"{split}_offsets"] = pack(seqs, dtype=id_dtype(vocab_size))
    if seqs2 is not None:
        out[f"{split}_flat2"], out[f"{split}_offsets2"] = pack(seqs2, dtype=id_dtype(vocab_size))
    out[f"{split}_targets"] = torch.tensor(list(labels), dtype=torch.long)
