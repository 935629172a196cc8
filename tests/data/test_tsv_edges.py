"""ListOps and Retrieval TSV files: a byte-order mark and trailing blank lines are tolerated (they
cannot change a record); a blank line between records is named."""

from __future__ import annotations

import pytest
from lra_fixtures import write_aan, write_listops

from longrange.data import load_task
from longrange.errors import DataFormatError

LISTOPS = ["( ( ( [MAX 4 ) 5 ) ] )\t5", "( ( ( [SM 4 ) 7 ) ] )\t1", "3\t3"]
AAN = {
    "train": ["1.0\ta1\ta2\tabc\tabd", "0.0\ta3\ta4\tbb\tcc"],
    "eval": ["0\te1\te2\tzz\tab"],
    "test": ["1.0\tt1\tt2\tcab\tb"],
}


def _items(data):
    return [(data.train[i]["inputs"].tolist(), int(data.train[i]["target"])) for i in range(len(data.train))]


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_listops_bom_and_trailing_blank_lines_are_tolerated(tmp_path, newline):
    reference = _items(load_task("listops", write_listops(tmp_path / "ref" / "listops", newline=newline)))
    folder = write_listops(
        tmp_path / "bom" / "listops",
        header="\ufeffSource\tTarget",
        splits={s: LISTOPS + ["", "  "] for s in ("train", "val", "test")},
        newline=newline,
    )
    data = load_task("listops", folder)
    assert _items(data) == reference and data.skipped == {}


def test_listops_blank_line_between_records_is_named(tmp_path):
    folder = write_listops(tmp_path / "d" / "listops", splits={"train": [LISTOPS[0], "", LISTOPS[1]]})
    with pytest.raises(DataFormatError, match=r"basic_train.tsv, line 3: blank line"):
        load_task("listops", folder)
    data = load_task("listops", folder, skip_bad=True)
    assert len(data.train) == 2 and data.skipped == {str(folder / "basic_train.tsv"): 1}


def test_listops_file_of_blank_lines_is_named(tmp_path):
    folder = write_listops(tmp_path / "d" / "listops")
    (folder / "basic_val.tsv").write_text("\n\n")
    with pytest.raises(DataFormatError, match=r"basic_val.tsv: no header line"):
        load_task("listops", folder)


def test_retrieval_bom_and_trailing_blank_lines_are_tolerated(tmp_path):
    ref = load_task("retrieval", write_aan(tmp_path / "ref" / "retrieval", AAN))
    edited = {k: list(v) for k, v in AAN.items()}
    edited["train"][0] = "\ufeff" + edited["train"][0]
    edited["train"] += ["", ""]
    data = load_task("retrieval", write_aan(tmp_path / "bom" / "retrieval", edited))
    assert len(data.train) == len(ref.train) == 2 and data.skipped == {}
    assert [int(data.train[i]["target"]) for i in range(2)] == [1, 0]
    assert data.vocab.tokens == ref.vocab.tokens


def test_retrieval_blank_line_between_records_is_named(tmp_path):
    splits = {**AAN, "test": ["", AAN["test"][0]]}
    with pytest.raises(DataFormatError, match=r"new_aan_pairs.test.tsv, line 1: blank line"):
        load_task("retrieval", write_aan(tmp_path / "d" / "retrieval", splits))
