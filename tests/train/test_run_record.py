"""The ``record`` section of a run's config.yaml as a type (train/rundir/record.py): written by a
stage, read back by inference, every field checked, older records readable."""

from __future__ import annotations

from dataclasses import fields

import pytest

from longrange.errors import DataFormatError
from longrange.train.rundir.record import FIELDS, RAN, RunRecord


def test_one_list_of_the_fields():
    assert [f.name for f in fields(RunRecord)] == list(FIELDS)
    assert set(RAN) <= set(FIELDS)


def test_a_record_round_trips_and_leaves_out_what_it_does_not_hold():
    record = RunRecord(
        data_dir="/data",
        skip_bad=False,
        skipped={},
        train_size=100,
        versions={"longrange": "0.1.0"},
        host="h",
        init={"from": None, "reverse_from": None},
        vocabulary={"tokens": ["a"]},
        kernels={"selective_scan": "numba"},
    )
    written = record.to_json()
    assert list(written) == [name for name in FIELDS if getattr(record, name) is not None]
    assert "transfer" not in written and "device" not in written
    assert RunRecord.from_json(written) == record


def test_an_older_newer_or_absent_record_reads_as_far_as_it_goes():
    assert RunRecord.from_json(None) == RunRecord() == RunRecord.from_json({})
    assert RunRecord.from_json({"host": "h", "vocabulary": None}).vocabulary is None
    assert RunRecord.from_json({"host": "h", "a_newer_field": 1}) == RunRecord(host="h")


@pytest.mark.parametrize(
    "record, message",
    [
        ({"train_size": "100"}, "field 'record.train_size' must be int, got str"),
        ({"skip_bad": 1}, "field 'record.skip_bad' must be bool"),
        ({"deterministic": "yes"}, "field 'record.deterministic' must be bool"),
        (["host"], "the 'record' section must be a mapping, got list"),
    ],
)
def test_a_damaged_record_is_an_error_naming_the_file_and_field(record, message, tmp_path):
    path = tmp_path / "config.yaml"
    with pytest.raises(DataFormatError, match=message) as err:
        RunRecord.from_json(record, path)
    assert str(path) in str(err.value)
