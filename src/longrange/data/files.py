"""What the loaders of the token tasks read from published files share (ListOps, Retrieval, Text).

* :func:`token_spec`: the :class:`TaskSpec` of a token classification task, its ``seq_len`` checked
  with the error every such task gives (``listops option seq_len must be >= 2, got 1``);
* :func:`load_split_files`: one file per split (ListOps' and Retrieval's ``.tsv`` files): the files
  are required, each is read once (bad records skipped and counted with ``skip_bad``), packed into
  a cache entry keyed by the files and the options, and the splits are served from that entry;
* :func:`prepared_splits`: the cache entry of any loader and the splits it holds (Text, whose
  reviews are many files per split).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from longrange.data.cache import cached
from longrange.data.dataset import SequenceDataset, TaskData, unpack_split
from longrange.data.reading import BadRecords, require_files
from longrange.data.spec import TaskSpec
from longrange.data.tokenize import Vocabulary
from longrange.errors import ConfigError, DataFormatError

R = TypeVar("R")


def token_spec(
    name: str,
    seq_len: int,
    *,
    n_classes: int,
    mask_ratio: float,
    description: str,
    layout: str,
    obtain: str,
    **fields: Any,
) -> TaskSpec:
    """The spec of a token classification task scored by accuracy; ``seq_len`` must be >= 2 (a
    token and the ``<eos>``)."""
    if seq_len < 2:
        raise ConfigError(f"{name} option seq_len must be >= 2, got {seq_len}")
    return TaskSpec(
        name=name,
        input_kind="tokens",
        seq_len=seq_len,
        n_classes=n_classes,
        metric="accuracy",
        mask_ratio=mask_ratio,
        description=description,
        layout=layout,
        obtain=obtain,
        **fields,
    )


def prepared_splits(
    data_dir: Path,
    name: str,
    sources: Sequence[Path],
    options: dict,
    build: Callable[[], dict],
    version: int,
    splits: Sequence[str],
) -> tuple[dict, dict[str, SequenceDataset]]:
    """The cache entry that ``build`` makes from ``sources`` (made once per sources, options and
    ``version``; see :func:`longrange.data.cache.cached`) and its ``splits`` (stored by
    :func:`~longrange.data.packing.pack_split`)."""
    prepared = cached(data_dir, name, sources, options, build, version=version)
    return prepared, {split: unpack_split(prepared, split) for split in splits}


def load_split_files(
    spec: TaskSpec,
    data_dir: Path,
    files: Mapping[str, Path],
    *,
    obtain: str,
    options: dict,
    version: int,
    skip_bad: bool,
    read: Callable[[Path, BadRecords], R],
    pack: Callable[[dict[str, R]], dict],
    vocab: Vocabulary | None = None,
) -> TaskData:
    """A task whose ``train``, ``val`` and ``test`` splits are one file each.

    ``read(path, bad)`` reads one file (handing the records it cannot read to ``bad``); ``pack``
    turns the splits' readings into a cache entry: ``tokens`` (the vocabulary) and each split
    stored by :func:`~longrange.data.packing.pack_split`. A fixed ``vocab`` (ListOps) must be the
    entry's; otherwise the entry's tokens are the vocabulary (built from the training split).
    """
    paths = list(files.values())
    require_files(paths, obtain)

    def build() -> dict:
        bad = BadRecords(skip_bad)
        readings = {split: read(path, bad) for split, path in files.items()}
        return {**pack(readings), "skipped": bad.counts}

    prepared, splits = prepared_splits(data_dir, spec.name, paths, options, build, version, list(files))
    if vocab is not None and prepared["tokens"] != list(vocab.tokens):
        raise DataFormatError(
            f"prepared vocabulary differs from the {spec.name} vocabulary; delete the cache entry", paths[0]
        )
    return TaskData(
        spec,
        splits["train"],
        splits["val"],
        splits["test"],
        vocab=vocab or Vocabulary(prepared["tokens"]),
        skipped=dict(prepared["skipped"]),
        info={"source": str(paths[0].parent)},
    )
