import pytest
import torch
from lra_fixtures import write_aan

from longrange.data import load_task, retrieval, task_status
from longrange.errors import DataFormatError, DataMissingError

GOOD = {
    "train": ["1.0\ta1\ta2\tabc\tabd", "0.0\ta3\ta4\tbb\tcc", "1\ta5\ta6\tab\tba"],
    "eval": ["0\te1\te2\tzz\tab"],
    "test": ["1.0\tt1\tt2\tcab\tb", "0.0\tt3\tt4\ta\tc"],
}


def test_loads_lra_layout_end_to_end(data_dir):
    write_aan(data_dir / "retrieval", GOOD)
    data = load_task("retrieval", data_dir)
    assert (len(data.train), len(data.val), len(data.test)) == (3, 1, 2)
    assert data.spec.two_sequences and data.spec.seq_len == 4000 and data.spec.mask_ratio == 0.15
    vocab = data.vocab
    # counts over both texts of train: a 4, b 6, c 2, d 1
    assert vocab.tokens == ("b", "a", "c", "d")
    item = data.train[0]
    assert vocab.decode(item["inputs"]) == ["a", "b", "c", "<eos>"]
    assert vocab.decode(item["inputs2"]) == ["a", "b", "d", "<eos>"]
    assert item["inputs"].dtype == item["inputs2"].dtype == torch.long
    assert [int(data.train[i]["target"]) for i in range(3)] == [1, 0, 1]
    assert vocab.decode(data.val[0]["inputs"]) == ["<unk>", "<unk>", "<eos>"]
    batch = data.collate([data.test[0], data.test[1]])
    assert batch["inputs"].shape == (2, 4) and batch["inputs2"].shape == (2, 2)
    assert batch["lengths"].tolist() == [4, 2] and batch["lengths2"].tolist() == [2, 2]


def test_seq_len_and_min_count(data_dir):
    write_aan(data_dir / "retrieval", GOOD)
    data = load_task("retrieval", data_dir, seq_len=3, min_count=3)
    assert data.vocab.tokens == ("b", "a")
    assert data.vocab.decode(data.test[0]["inputs"]) == ["<unk>", "a", "<eos>"]


BAD = {
    "columns": ("1.0\tx\ty\tonly four", 2, "expected 5 tab-separated columns"),
    "label": ("2.0\tx\ty\ta\tb", 2, "label must be 0 or 1, found '2.0'"),
    "label text": ("yes\tx\ty\ta\tb", 2, "label must be 0 or 1, found 'yes'"),
    "empty text": ("1\tx\ty\t\tb", 2, "empty text1"),
    "header": (
        "label\tid1\tid2\ttext1\ttext2",
        1,
        "label must be 0 or 1, found .label. \\(these files have no header line",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_records_name_file_and_line(data_dir, case):
    line, number, message = BAD[case]
    lines = [line, "0\ta\tb\tc\td"] if number == 1 else ["0\ta\tb\tc\td", line]
    write_aan(data_dir / "retrieval", {**GOOD, "test": lines})
    path = data_dir / "retrieval" / "new_aan_pairs.test.tsv"
    with pytest.raises(DataFormatError, match=f"{path}, line {number}: {message}"):
        load_task("retrieval", data_dir)


def test_empty_file_and_skip_bad(data_dir, capsys):
    write_aan(data_dir / "retrieval", {**GOOD, "eval": []})
    with pytest.raises(DataFormatError, match="new_aan_pairs.eval.tsv: empty file"):
        load_task("retrieval", data_dir)
    write_aan(data_dir / "retrieval", {**GOOD, "eval": ["0\te1\te2\tzz\tab", "3\tx\ty\ta\tb", "1\tx\ty"]})
    data = load_task("retrieval", data_dir, skip_bad=True)
    path = str(data_dir / "retrieval" / "new_aan_pairs.eval.tsv")
    assert data.skipped == {path: 2} and len(data.val) == 1
    assert "skipped 2 bad record(s)" in capsys.readouterr().err


def test_missing_data(data_dir):
    with pytest.raises(DataMissingError, match=r"retrieval/new_aan_pairs.train.tsv.*lra_release"):
        load_task("retrieval", data_dir)
    assert not task_status("retrieval", data_dir)[0]
    write_aan(data_dir / "retrieval", GOOD)
    assert task_status("retrieval", data_dir)[0]


def test_second_load_uses_the_cache(data_dir, monkeypatch):
    write_aan(data_dir / "retrieval", GOOD)
    calls = []
    real = retrieval.read_pairs_file
    monkeypatch.setattr(retrieval, "read_pairs_file", lambda *a: calls.append(1) or real(*a))
    load_task("retrieval", data_dir)
    load_task("retrieval", data_dir)
    assert len(calls) == 3
    load_task("retrieval", data_dir, min_count=2)
    assert len(calls) == 6
