"""``summary.json`` as a type (``longrange.train.rundir.summary``): what a stage writes is what the
report reads, field by field, through one definition of the fields."""

from __future__ import annotations

import dataclasses
import json

import pytest

from longrange.errors import DataFormatError
from longrange.train.rundir.summary import FIELDS, SUMMARY_FORMAT, ParamCounts, RunSummary


def _summary(**kw) -> RunSummary:
    base = dict(
        task="listops",
        label="S4D",
        regime="scratch",
        stage="train",
        seed=3,
        metric="accuracy",
        higher_is_better=True,
        best_val={"accuracy": 0.5, "loss": None},
        steps=100,
        params=ParamCounts(1000, 600, 64),
        seconds=12.5,
        test={"accuracy": 0.45},
        versions={"longrange": "0.1.0"},
        kernels={"vandermonde": "numba"},
    )
    return RunSummary(**{**base, **kw})


def test_fields_list_every_field_of_the_type_and_only_those():
    assert set(FIELDS) == {f.name for f in dataclasses.fields(RunSummary)}


def test_a_summary_round_trips_through_json():
    s = _summary()
    text = json.dumps(s.to_json())
    back = RunSummary.from_json(json.loads(text), "summary.json")
    assert back == s and back.format == SUMMARY_FORMAT
    assert list(s.to_json()) == list(FIELDS)  # the file's order
    assert back.version == "0.1.0" and back.best_val["accuracy"] == 0.5 and back.test == {"accuracy": 0.45}
    assert "state" not in _summary(params=ParamCounts(10, 5)).to_json()["params"]


def test_a_summary_written_before_the_optional_fields_and_the_format_reads():
    old = {k: v for k, v in _summary().to_json().items() if FIELDS[k][1]}  # the required fields only
    s = RunSummary.from_json(old, "old/summary.json")
    assert s.format == 1 and s.test is None and s.kernels is None and s.version is None


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.pop("seed"), "missing field 'seed'"),
        (lambda d: d.update(seed="3"), "field 'seed' must be int, got str '3'"),
        (lambda d: d.update(steps=True), "field 'steps' must be int, got bool True"),
        (lambda d: d.update(stage="eval"), "field 'stage' must be one of train, finetune, pretrain"),
        (lambda d: d.update(best_val={"loss": 1.0}), "field 'best_val' has no 'accuracy'"),
        (lambda d: d.update(test={"accuracy": "high"}), "field 'test.accuracy' must be a number or null"),
        (lambda d: d["params"].pop("total"), "missing field 'total'"),
        (lambda d: d.update(format=SUMMARY_FORMAT + 1), "newer than this longrange reads"),
    ],
)
def test_a_bad_summary_names_the_file_and_the_field(change, message):
    d = json.loads(json.dumps(_summary().to_json()))
    change(d)
    with pytest.raises(DataFormatError, match=r"runs/x/summary.json: .*" + message.replace("(", r"\(")):
        RunSummary.from_json(d, "runs/x/summary.json")
