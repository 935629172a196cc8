import os

import pytest
import torch
from lra_fixtures import write_listops

from longrange.data import listops, load_task, task_status
from longrange.data.listops import LISTOPS_TOKENS, tokenize_source
from longrange.data.tokenize import SPECIALS
from longrange.errors import DataFormatError, DataMissingError


def test_tokenizer_drops_parentheses_and_keeps_closing_bracket():
    assert tokenize_source("( ( ( [MAX 4 ) 5 ) ] )") == ["[MAX", "4", "5", "]"]
    assert tokenize_source("7") == ["7"]


def test_loads_lra_layout_end_to_end(data_dir):
    write_listops(data_dir / "listops")
    data = load_task("listops", data_dir)
    vocab = data.vocab
    assert len(vocab) == 20 and vocab.decode(range(5)) == list(SPECIALS)
    assert vocab.tokens == LISTOPS_TOKENS
    assert len(data.train) == len(data.val) == len(data.test) == 3
    item = data.train[0]
    assert vocab.decode(item["inputs"]) == ["[MAX", "4", "5", "]", "<eos>"]
    assert item["inputs"].dtype == torch.long and int(item["target"]) == 5
    assert [int(data.test[i]["target"]) for i in range(3)] == [5, 1, 3]
    assert data.spec.n_classes == 10 and data.spec.mask_ratio == 0.1 and data.spec.seq_len == 2048
    assert data.skipped == {}
    batch = data.collate([data.train[0], data.train[2]])
    assert batch["inputs"].shape == (2, 5) and batch["inputs"][1].tolist() == [8, 2, 0, 0, 0]


def test_data_dir_may_point_at_the_listops_folder(tmp_path):
    folder = write_listops(tmp_path / "mine", newline="\n")
    assert len(load_task("listops", folder).train) == 3
    assert task_status("listops", folder)[0]


BAD_CASES = {
    "columns": (["( ( [MIN 1 ) ] )\t1\textra"], 2, "2 tab-separated columns"),
    "label range": (["3\t3", "( ( [MIN 1 ) ] )\t10"], 3, "Target must be an integer 0-9, found '10'"),
    "label float": (["( ( [MIN 1 ) ] )\t1.0"], 2, "found '1.0'"),
    "label missing": (["( ( [MIN 1 ) ] )\t"], 2, "found ''"),
    "token": (
        ["3\t3", "3\t3", "( ( [FIRST 1 ) ] )\t1"],
        4,
        "token '\\[FIRST' \\(position 0\\) is not in the vocabulary",
    ),
    "empty source": (["( )\t1"], 2, "empty Source"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_records_name_file_and_line(data_dir, case):
    lines, line_no, message = BAD_CASES[case]
    write_listops(data_dir / "listops", {"val": lines})
    path = data_dir / "listops" / "basic_val.tsv"
    with pytest.raises(DataFormatError, match=f"{path}, line {line_no}: .*{message}") as info:
        load_task("listops", data_dir)
    assert info.value.path == path and info.value.line == line_no


def test_missing_header_and_empty_files(data_dir):
    write_listops(data_dir / "listops", header="( ( [MIN 1 ) ] )\t1")
    with pytest.raises(DataFormatError, match="basic_train.tsv, line 1: expected the header"):
        load_task("listops", data_dir)
    write_listops(data_dir / "listops")
    (data_dir / "listops" / "basic_test.tsv").write_bytes(b"")
    with pytest.raises(DataFormatError, match="basic_test.tsv: empty file"):
        load_task("listops", data_dir)
    (data_dir / "listops" / "basic_test.tsv").write_bytes(b"Source\tTarget\r\n")
    with pytest.raises(DataFormatError, match="basic_test.tsv: no samples"):
        load_task("listops", data_dir)


def test_skip_bad_skips_and_reports(data_dir, capsys):
    write_listops(data_dir / "listops", {"train": ["3\t3", "( ( [MIN 1 ) ] )\t12", "x\t1", "4\t4"]})
    data = load_task("listops", data_dir, skip_bad=True)
    path = str(data_dir / "listops" / "basic_train.tsv")
    assert data.skipped == {path: 2}
    assert len(data.train) == 2 and [int(data.train[i]["target"]) for i in range(2)] == [3, 4]
    assert f"skipped 2 bad record(s) in {path}" in capsys.readouterr().err
    # the count is kept with the prepared data
    assert load_task("listops", data_dir, skip_bad=True).skipped == {path: 2}


def test_too_long_is_an_error_unless_truncating(data_dir):
    write_listops(data_dir / "listops", {"test": ["3\t3", "( ( ( ( [SM 1 ) 2 ) 3 ) ] )\t6"]})
    with pytest.raises(DataFormatError, match=r"basic_test.tsv, line 3: 5 tokens \+ <eos> exceed seq_len 5"):
        load_task("listops", data_dir, seq_len=5)
    data = load_task("listops", data_dir, seq_len=5, truncate=True)
    assert data.vocab.decode(data.test[1]["inputs"]) == ["[SM", "1", "2", "3", "<eos>"]
    assert data.spec.seq_len == 5


def test_missing_data_names_the_path_and_the_generator(data_dir):
    with pytest.raises(DataMissingError, match=r"listops/basic_train.tsv.*longrange data generate listops"):
        load_task("listops", data_dir)
    present, lines = task_status("listops", data_dir)
    assert not present and len(lines) == 3 and all(line.endswith("missing") for line in lines)


def test_second_load_uses_the_cache_and_a_touched_file_rebuilds(data_dir, monkeypatch):
    write_listops(data_dir / "listops")
    calls = []
    real = listops.read_listops_file
    monkeypatch.setattr(listops, "read_listops_file", lambda *a, **k: calls.append(1) or real(*a, **k))
    first = load_task("listops", data_dir)
    assert len(calls) == 3
    second = load_task("listops", data_dir)
    assert len(calls) == 3
    assert torch.equal(first.train[1]["inputs"], second.train[1]["inputs"])
    load_task("listops", data_dir, seq_len=100)
    assert len(calls) == 6
    path = data_dir / "listops" / "basic_val.tsv"
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))
    load_task("listops", data_dir)
    assert len(calls) == 9
