"""Text (Long Range Arena): IMDB sentiment classification at the character level.

Files (the Stanford release, ``aclImdb_v1.tar.gz`` unpacked)::

    <data_dir>/text/aclImdb/{train,test}/{pos,neg}/<id>_<rating>.txt     25k train / 25k test

Labels: neg 0, pos 1. Each review is split into characters, cut to ``seq_len - 1`` characters and
ended with ``<eos>`` (the LRA definition truncates; the S4 pipeline appends the ``<eos>``). The
vocabulary holds the characters seen at least ``min_count`` times (default 15, as LRA/S4) in the
(truncated) training reviews; rarer characters become ``<unk>``. It is built once and saved with the
prepared data.

Validation: LRA and the S4/SPT code evaluate on the test split during training (there is no
validation split); ``val_from_train=0`` (the default) does the same, so ``val`` *is* ``test``. A
fraction ``val_from_train`` in (0, 1) instead holds out that part of the training reviews (chosen
by the seed) as the validation split.

``source="hf"`` reads the HuggingFace ``imdb`` data set instead (needs the ``datasets`` package,
imported only then; its cache goes to ``<data_dir>/text/hf``).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Subset

from longrange.data.dataset import TaskData
from longrange.data.files import prepared_splits, token_spec
from longrange.data.locations import task_dir
from longrange.data.packing import pack_split
from longrange.data.reading import BadRecords, require_files
from longrange.data.registry import register_task
from longrange.data.spec import TaskSpec
from longrange.data.tokenize import Vocabulary
from longrange.errors import ConfigError, DataFormatError, DataMissingError

SUBDIR = "text"
LABELS = {"neg": 0, "pos": 1}
SPLITS = ("train", "test")
OBTAIN = (
    "download https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz and unpack it into "
    "<data_dir>/text/ (giving <data_dir>/text/aclImdb/train/pos/...), or install the `datasets` package "
    "and use the task option source=hf"
)
LOADER_VERSION = 2
OPTIONS = {"seq_len": 4096, "min_count": 15, "val_from_train": 0.0, "source": "files"}


def text_spec(seq_len: int = 4096, min_count: int = 15, val_from_train: float = 0.0, source: str = "files") -> TaskSpec:
    if min_count < 1:
        raise ConfigError(f"text option min_count must be >= 1, got {min_count}")
    if not 0.0 <= val_from_train < 1.0:
        raise ConfigError(f"text option val_from_train must be in [0, 1), got {val_from_train}")
    if source not in ("files", "hf"):
        raise ConfigError(f"text option source must be 'files' or 'hf', got {source!r}")
    return token_spec(
        "text",
        seq_len,
        n_classes=2,
        mask_ratio=0.15,
        description="LRA Text: IMDB review sentiment from characters (+ <eos>); val = test unless val_from_train",
        layout="text/aclImdb/{train,test}/{pos,neg}/*.txt (the Stanford aclImdb release; 25k/25k)",
        obtain=OBTAIN,
    )


def _review_order(path: Path) -> tuple:
    """Files sort by their numeric id (``<id>_<rating>.txt``), then by name."""
    match = re.match(r"(\d+)_", path.name)
    return (int(match.group(1)) if match else -1, path.name)


def review_files(root: Path, split: str) -> list[tuple[Path, int]]:
    """(file, label) of one split, neg then pos, each in id order."""
    out = []
    for name, label in LABELS.items():
        folder = root / "aclImdb" / split / name
        files = sorted(folder.glob("*.txt"), key=_review_order)
        if not files:
            raise DataMissingError(f"no .txt reviews in {folder}; {OBTAIN}")
        out += [(f, label) for f in files]
    return out


def read_review(path: Path) -> str:
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataFormatError(f"not valid UTF-8 ({err.reason} at byte {err.start})", path) from None
    if not text.strip():
        raise DataFormatError("empty review", path)
    return text


def encode_documents(texts: list[str], vocab: Vocabulary, max_chars: int) -> list[np.ndarray]:
    """Character ids of each text cut to ``max_chars``, followed by ``<eos>``."""
    eos = np.array([vocab.eos_id], dtype=np.int32)
    return [np.concatenate([vocab.encode_chars(t[:max_chars]), eos]) for t in texts]


def _prepare(texts: dict[str, list[str]], labels: dict[str, list[int]], seq_len: int, min_count: int) -> dict:
    max_chars = seq_len - 1
    vocab = Vocabulary.build_chars((t[:max_chars] for t in texts["train"]), min_count=min_count)
    out: dict = {"tokens": list(vocab.tokens)}
    for split in SPLITS:
        pack_split(out, split, encode_documents(texts[split], vocab, max_chars), labels[split], len(vocab))
    return out


def _read_files(root: Path, skip_bad: bool) -> tuple[dict, dict, dict]:
    bad = BadRecords(skip_bad)
    texts: dict[str, list[str]] = {}
    labels: dict[str, list[int]] = {}
    for split in SPLITS:
        texts[split], labels[split] = [], []
        for path, label in review_files(root, split):
            try:
                text = read_review(path)
            except DataFormatError as err:
                bad.handle(err)
                continue
            texts[split].append(text)
            labels[split].append(label)
    return texts, labels, bad.counts


def _read_hf(cache: Path) -> tuple[dict, dict]:
    try:
        import datasets  # optional; only this path needs it
    except ImportError:
        raise ConfigError("text option source=hf needs the `datasets` package (pip install datasets)") from None
    loaded = datasets.load_dataset("imdb", cache_dir=str(cache))
    texts = {split: list(loaded[split]["text"]) for split in SPLITS}
    labels = {split: [int(x) for x in loaded[split]["label"]] for split in SPLITS}
    return texts, labels


def text_expected_paths(data_dir: Path, source: str = "files", **options) -> list[Path]:
    root = task_dir(data_dir, SUBDIR, "aclImdb")
    if source == "hf":
        return [root]
    return [root / "aclImdb" / split / name for split in SPLITS for name in LABELS]


def load_text(
    data_dir: Path,
    spec: TaskSpec,
    seed: int = 0,
    skip_bad: bool = False,
    seq_len: int = 4096,
    min_count: int = 15,
    val_from_train: float = 0.0,
    source: str = "files",
) -> TaskData:
    """Load IMDB from ``data_dir/text/aclImdb`` (see the module docstring)."""
    root = task_dir(data_dir, SUBDIR, "aclImdb")
    options = {"seq_len": seq_len, "min_count": min_count, "source": source, "skip_bad": skip_bad}
    if source == "hf":
        sources: list[Path] = []

        def build() -> dict:
            texts, labels = _read_hf(root / "hf")
            return {**_prepare(texts, labels, seq_len, min_count), "skipped": {}}
    else:
        sources = text_expected_paths(data_dir)
        require_files(sources, OBTAIN)

        def build() -> dict:
            texts, labels, skipped = _read_files(root, skip_bad)
            for split in SPLITS:
                if not texts[split]:
                    raise DataFormatError(f"no readable reviews in the {split} split", root / "aclImdb" / split)
            return {**_prepare(texts, labels, seq_len, min_count), "skipped": skipped}

    prepared, splits = prepared_splits(data_dir, "text", sources, options, build, LOADER_VERSION, SPLITS)
    vocab = Vocabulary(prepared["tokens"])
    train, test = splits["train"], splits["test"]
    info = {"source": source, "val": "test split" if val_from_train == 0 else f"{val_from_train} of train"}
    if val_from_train == 0:
        val = test
        kept = train
    else:
        n = len(train)
        n_val = max(1, round(val_from_train * n))
        if n_val >= n:
            raise ConfigError(f"text option val_from_train={val_from_train} leaves no training reviews (of {n})")
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed))).tolist()
        val = Subset(train, sorted(perm[:n_val]))
        kept = Subset(train, sorted(perm[n_val:]))
    return TaskData(spec, kept, val, test, vocab=vocab, skipped=dict(prepared["skipped"]), info=info)


register_task("text", text_spec, load_text, OPTIONS, expected=text_expected_paths)
