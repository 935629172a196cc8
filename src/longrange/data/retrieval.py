"""Retrieval (Long Range Arena): do two ACL Anthology Network papers cite each other?

Files (``lra_release/lra_release/tsv_data`` of the LRA release)::

    <data_dir>/retrieval/new_aan_pairs.{train,eval,test}.tsv

Tab-separated, no header, no quoting (the LRA reader sets ``header=False, use_quote_delim=False``),
five columns: label, id1, id2, text1, text2. The label is stored as a number ("1" or "1.0", read
as a float by LRA) and must be 0 or 1. The ``eval`` file is the validation split.

Each document is split into characters, cut to ``seq_len - 1`` characters and ended with ``<eos>``
(as the S4 pipeline: 4000 positions per document). The vocabulary holds the characters seen at least
``min_count`` times (default 1, as S4) in both documents of the (truncated) training pairs.
Items carry the two documents as ``inputs`` and ``inputs2``.

A UTF-8 byte-order mark at the start and blank lines at the end of a file are ignored
(``data/tsv.py``); a blank line between records is an error naming its line.
"""

from __future__ import annotations

from pathlib import Path

from longrange.data.dataset import TaskData
from longrange.data.files import load_split_files, token_spec
from longrange.data.locations import task_dir
from longrange.data.packing import pack_split
from longrange.data.reading import BadRecords
from longrange.data.registry import register_task
from longrange.data.spec import TaskSpec
from longrange.data.text import encode_documents
from longrange.data.tokenize import Vocabulary
from longrange.data.tsv import read_tsv
from longrange.errors import ConfigError, DataFormatError

SUBDIR = "retrieval"
SPLITS = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}
COLUMNS = ("label", "id1", "id2", "text1", "text2")
OBTAIN = (
    "download lra_release.gz from https://github.com/google-research/long-range-arena, unpack it and copy "
    "lra_release/tsv_data/new_aan_pairs.{train,eval,test}.tsv to <data_dir>/retrieval/"
)
LOADER_VERSION = 4  # 4: the first documents stored under {split}_flat (were {split}_flat1)


def retrieval_spec(seq_len: int = 4000, min_count: int = 1) -> TaskSpec:
    if min_count < 1:
        raise ConfigError(f"retrieval option min_count must be >= 1, got {min_count}")
    return token_spec(
        "retrieval",
        seq_len,
        n_classes=2,
        mask_ratio=0.15,
        two_sequences=True,
        description="LRA Retrieval: AAN citation link between two papers, characters (+ <eos>) per document",
        layout="retrieval/new_aan_pairs.{train,eval,test}.tsv (no header; label, id1, id2, text1, text2)",
        obtain=OBTAIN,
    )


def parse_label(text: str, path: Path, line: int) -> int:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if value not in (0.0, 1.0):
        hint = " (these files have no header line)" if line == 1 and text.strip().lower() == "label" else ""
        raise DataFormatError(f"label must be 0 or 1, found {text!r}{hint}", path, line)
    return int(value)


def read_pairs_file(path: Path, bad: BadRecords | None = None) -> tuple[list[str], list[str], list[int]]:
    """The two texts and the label of every pair in one ``.tsv`` file."""

    def parse(cols: list[str], number: int) -> tuple[str, str, int]:
        label = parse_label(cols[0], path, number)
        if not cols[3] or not cols[4]:
            raise DataFormatError(f"empty {'text1' if not cols[3] else 'text2'}", path, number)
        return cols[3], cols[4], label

    records = read_tsv(path, COLUMNS, parse, bad, empty="no pairs")
    return [r[0] for r in records], [r[1] for r in records], [r[2] for r in records]


def retrieval_expected_paths(data_dir: Path, **options) -> list[Path]:
    folder = task_dir(data_dir, SUBDIR, SPLITS["train"])
    return [folder / name for name in SPLITS.values()]


def load_retrieval(
    data_dir: Path, spec: TaskSpec, seed: int = 0, skip_bad: bool = False, seq_len: int = 4000, min_count: int = 1
) -> TaskData:
    """Load AAN from ``data_dir/retrieval`` (or ``data_dir`` itself when it holds the files)."""
    max_chars = seq_len - 1

    def pack(readings: dict) -> dict:
        t1, t2, _ = readings["train"]
        vocab = Vocabulary.build_chars((t[:max_chars] for t in t1 + t2), min_count=min_count)
        out: dict = {"tokens": list(vocab.tokens)}
        for split, (texts1, texts2, labels) in readings.items():
            pack_split(
                out,
                split,
                encode_documents(texts1, vocab, max_chars),
                labels,
                len(vocab),
                encode_documents(texts2, vocab, max_chars),
            )
        return out

    return load_split_files(
        spec,
        data_dir,
        dict(zip(SPLITS, retrieval_expected_paths(data_dir))),
        obtain=OBTAIN,
        options={"seq_len": seq_len, "min_count": min_count, "skip_bad": skip_bad},
        version=LOADER_VERSION,
        skip_bad=skip_bad,
        read=read_pairs_file,
        pack=pack,
    )


register_task(
    "retrieval", retrieval_spec, load_retrieval, {"seq_len": 4000, "min_count": 1}, expected=retrieval_expected_paths
)
