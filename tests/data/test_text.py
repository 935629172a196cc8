import importlib.util

import pytest
import torch
from lra_fixtures import write_imdb

from longrange.data import load_task, task_status, text
from longrange.errors import ConfigError, DataFormatError, DataMissingError

DOCS = {
    "train": {"pos": ["great film", "loved it", "fine fine"], "neg": ["bad film", "awful!"]},
    "test": {"pos": ["good"], "neg": ["terrible", "dull"]},
}


@pytest.fixture
def imdb(data_dir):
    write_imdb(data_dir / "text", DOCS)
    return data_dir


def decode(vocab, ids):
    return "".join(vocab.decode(ids))


def test_loads_stanford_layout_end_to_end(imdb):
    data = load_task("text", imdb, min_count=1)
    assert (len(data.train), len(data.test)) == (5, 3)
    assert data.val is data.test  # val_from_train = 0: LRA/S4 evaluate on the test split
    vocab = data.vocab
    assert vocab.decode(range(5)) == ["<pad>", "<unk>", "<eos>", "<cls>", "<mask>"]
    # neg first, then pos, each in file-id order; labels neg 0, pos 1
    items = [data.train[i] for i in range(5)]
    assert [int(it["target"]) for it in items] == [0, 0, 1, 1, 1]
    assert vocab.decode(items[0]["inputs"])[-1] == "<eos>" and items[0]["inputs"].dtype == torch.long
    assert decode(vocab, items[0]["inputs"][:-1]) == "bad film"
    assert decode(vocab, data.test[2]["inputs"][:-1]) == "good"
    spec = data.spec
    assert (spec.seq_len, spec.n_classes, spec.mask_ratio, spec.input_kind) == (4096, 2, 0.15, "tokens")


def test_vocabulary_keeps_characters_seen_min_count_times_in_train(imdb):
    data = load_task("text", imdb, min_count=3)
    # counts in train: 'f' 5, 'i' 5, ' ' 4, 'e' 4, 'l' 4, 'a' 3, 'd' 2, 'n' 2, ...
    assert data.vocab.tokens == ("f", "i", " ", "e", "l", "a")
    ids = data.test[0]["inputs"]  # "terrible": t r r b unseen or rare -> <unk>
    assert decode(data.vocab, ids[:-1]) == "<unk>e<unk><unk>i<unk>le"


def test_truncates_to_seq_len_with_eos(imdb):
    data = load_task("text", imdb, seq_len=4, min_count=1)
    assert data.vocab.decode(data.train[3]["inputs"]) == ["l", "o", "v", "<eos>"]
    assert all(len(data.train[i]["inputs"]) <= 4 for i in range(5))


def test_val_from_train_holds_out_a_seeded_part(imdb):
    a = load_task("text", imdb, min_count=1, val_from_train=0.4, seed=1)
    b = load_task("text", imdb, min_count=1, val_from_train=0.4, seed=1)
    assert (len(a.train), len(a.val)) == (3, 2)
    assert a.val.indices == b.val.indices
    assert sorted(a.val.indices + a.train.indices) == list(range(5))
    with pytest.raises(ConfigError, match="val_from_train"):
        load_task("text", imdb, val_from_train=1.0)


def test_bad_reviews_name_the_file(imdb):
    bad = imdb / "text" / "aclImdb" / "test" / "neg" / "7_1.txt"
    bad.write_bytes(b"\xff\xfe not utf8")
    with pytest.raises(DataFormatError, match=f"{bad}: not valid UTF-8"):
        load_task("text", imdb, min_count=1)
    bad.write_text("  \n")
    with pytest.raises(DataFormatError, match=f"{bad}: empty review"):
        load_task("text", imdb, min_count=1)
    data = load_task("text", imdb, min_count=1, skip_bad=True)
    assert data.skipped == {str(bad): 1} and len(data.test) == 3


def test_missing_data_names_the_path_and_source(data_dir):
    with pytest.raises(
        DataMissingError, match=r"text/aclImdb/train/neg but it does not exist; download .*aclImdb_v1.tar.gz"
    ):
        load_task("text", data_dir)
    present, lines = task_status("text", data_dir)
    assert not present and len(lines) == 4
    write_imdb(data_dir / "text", {"train": {"pos": ["a"], "neg": ["b"]}, "test": {"pos": ["c"]}})
    (data_dir / "text" / "aclImdb" / "test" / "neg").mkdir()
    with pytest.raises(DataMissingError, match=r"no \.txt reviews in .*test/neg"):
        load_task("text", data_dir)


def test_cache_skips_reading_and_a_new_file_rebuilds(imdb, monkeypatch):
    calls = []
    real = text.read_review
    monkeypatch.setattr(text, "read_review", lambda p: calls.append(p) or real(p))
    load_task("text", imdb, min_count=1)
    assert len(calls) == 8
    load_task("text", imdb, min_count=1)
    assert len(calls) == 8
    (imdb / "text" / "aclImdb" / "train" / "pos" / "9_9.txt").write_text("new")
    assert len(load_task("text", imdb, min_count=1).train) == 6
    assert len(calls) == 17


@pytest.mark.skipif(importlib.util.find_spec("datasets") is not None, reason="datasets is installed")
def test_hf_source_without_datasets_is_a_clear_error(data_dir):
    with pytest.raises(ConfigError, match="pip install datasets"):
        load_task("text", data_dir, source="hf")


def test_bad_options():
    with pytest.raises(ConfigError, match="source must be 'files' or 'hf'"):
        load_task("text", "x", source="web")
    with pytest.raises(ConfigError, match="min_count"):
        load_task("text", "x", min_count=0)
