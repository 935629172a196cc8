"""The loader shared by the file-based token tasks (``data/files.py``): one file per split read once
into a cache entry, bad records counted, a fixed vocabulary checked against the entry, and the
common spec check."""

from __future__ import annotations

import pytest

from longrange.data.files import load_split_files, token_spec
from longrange.data.tasks import BadRecords, pack_split
from longrange.data.tokenize import Vocabulary
from longrange.errors import ConfigError, DataFormatError, DataMissingError


def _spec():
    return token_spec("words", 8, n_classes=2, mask_ratio=0.15, description="d", layout="l", obtain="o")


def _files(tmp_path, lines):
    files = {}
    for split in ("train", "val", "test"):
        path = tmp_path / f"{split}.txt"
        path.write_text("".join(f"{line}\n" for line in lines))
        files[split] = path
    return files


def _read(path, bad: BadRecords):
    seqs, labels = [], []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        word, _, label = line.partition(" ")
        try:
            if label not in ("0", "1"):
                raise DataFormatError(f"label must be 0 or 1, found {label!r}", path, number)
        except DataFormatError as err:
            bad.handle(err)
            continue
        seqs.append([5 + ord(c) - ord("a") for c in word])
        labels.append(int(label))
    return seqs, labels


def _pack(vocab):
    def pack(readings):
        out = {"tokens": list(vocab.tokens)}
        for split, (seqs, labels) in readings.items():
            pack_split(out, split, seqs, labels, len(vocab))
        return out

    return pack


def test_splits_are_read_once_into_a_cache_entry_and_bad_records_counted(tmp_path):
    vocab = Vocabulary(["a", "b", "c"], strict=True)
    files = _files(tmp_path, ["ab 1", "c 0", "bad 7"])
    reads = []

    def read(path, bad):
        reads.append(path.name)
        return _read(path, bad)

    kwargs = dict(
        obtain="write them",
        options={"skip_bad": True},
        version=1,
        skip_bad=True,
        read=read,
        pack=_pack(vocab),
        vocab=vocab,
    )
    data = load_split_files(_spec(), tmp_path, files, **kwargs)
    assert (len(data.train), len(data.val), len(data.test)) == (2, 2, 2)
    assert data.train[0]["inputs"].tolist() == [5, 6] and int(data.train[1]["target"]) == 0
    assert sum(data.skipped.values()) == 3 and data.info["source"] == str(tmp_path)
    again = load_split_files(_spec(), tmp_path, files, **kwargs)  # served from the cache entry
    assert reads == ["train.txt", "val.txt", "test.txt"] and again.train[0]["inputs"].tolist() == [5, 6]
    with pytest.raises(DataFormatError, match="label must be 0 or 1, found '7'"):
        load_split_files(_spec(), tmp_path, files, **{**kwargs, "skip_bad": False, "options": {"skip_bad": False}})


def test_a_fixed_vocabulary_must_be_the_cache_entry_s(tmp_path):
    files = _files(tmp_path, ["ab 1"])
    old, new = Vocabulary(["a", "b"], strict=True), Vocabulary(["a", "b", "c"], strict=True)
    kwargs = dict(obtain="o", options={}, version=1, skip_bad=False, read=_read)
    load_split_files(_spec(), tmp_path, files, pack=_pack(old), vocab=old, **kwargs)
    with pytest.raises(DataFormatError, match="train.txt.*prepared vocabulary differs from the words vocabulary"):
        load_split_files(_spec(), tmp_path, files, pack=_pack(old), vocab=new, **kwargs)


def test_missing_files_and_a_bad_length_are_named(tmp_path):
    with pytest.raises(DataMissingError, match=r"train.txt but it does not exist; write them"):
        load_split_files(
            _spec(),
            tmp_path,
            {s: tmp_path / f"{s}.txt" for s in ("train", "val", "test")},
            obtain="write them",
            options={},
            version=1,
            skip_bad=False,
            read=_read,
            pack=dict,
        )
    with pytest.raises(ConfigError, match="words option seq_len must be >= 2, got 1"):
        token_spec("words", 1, n_classes=2, mask_ratio=0.1, description="", layout="", obtain="")
    spec = token_spec("pairs", 4, n_classes=2, mask_ratio=0.1, description="", layout="", obtain="", two_sequences=True)
    assert spec.two_sequences and spec.input_kind == "tokens" and spec.metric == "accuracy"
