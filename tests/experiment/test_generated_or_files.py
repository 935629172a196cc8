"""A generated-data preset (the demo's) pointed at the task's own files: while ``task.generate`` is set
the files are not read, and a note says so, naming ``task.generate=null`` (and ``task.train_subset=null``
where the preset keeps a subset); with both set to null the files are read, and a subset too small
for a batch is named as the cause."""

from __future__ import annotations

import importlib

import pytest

from longrange.cli import main
from longrange.errors import ConfigError
from longrange.experiment import taskdata
from longrange.experiment.config import resolve

C = importlib.import_module("longrange.experiment.compare")
#: The demo's generated ListOps at a few sequences (the preset's `short`, shrunk).
TINY = "{config: short, n_train: 40, n_val: 8, n_test: 8, min_length: 8, max_length: 32, max_depth: 3, max_args: 3}"


def _files(root, n_train):
    """A data directory with the task's own ListOps files (n_train training sequences)."""
    from longrange.data.generate.listops import generate

    generate(
        root / "listops",
        n_train=n_train,
        n_val=8,
        n_test=8,
        min_length=8,
        max_length=24,
        max_depth=3,
        max_args=3,
        seed=0,
        quiet=True,
    )
    return root


@pytest.fixture(scope="module")
def own_files(tmp_path_factory):
    return _files(tmp_path_factory.mktemp("mine"), 20)


def test_the_note_names_the_files_and_both_settings(own_files):
    exp = resolve("demo/s4d", overrides=[f"task.data_dir={own_files}"])
    assert exp.task.generate is not None and exp.task.train_subset == 0.1  # the preset's
    note = taskdata.unread_files_note(exp.task)
    assert note.startswith("note: listops: task.generate is set ({'config': 'short'}), so the generated data is read")
    assert f"the task's own files in {own_files / 'listops'} are not" in note
    assert note.endswith(
        "to train on those files, add task.generate=null and task.train_subset=null (it is 0.1: part "
        "of the training set)"
    )
    whole = resolve("demo/s4d", overrides=[f"task.data_dir={own_files}", "task.train_subset=null"])
    assert taskdata.unread_files_note(whole.task).endswith("add task.generate=null")


def test_no_note_without_files_or_without_generated_data(own_files, tmp_path):
    assert taskdata.unread_files_note(resolve("demo/s4d", overrides=[f"task.data_dir={tmp_path}"]).task) is None
    files = resolve("demo/s4d", overrides=[f"task.data_dir={own_files}", "task.generate=null"])
    assert taskdata.unread_files_note(files.task) is None


def test_the_dry_run_and_the_run_say_it_once(own_files, capsys, monkeypatch):
    out = own_files.parent / "dry"
    assert main(["compare", "--preset", "demo/s4d", "--out", str(out), "--dry-run", "--data-dir", str(own_files)]) == 0
    data = capsys.readouterr().out.split("data:\n", 1)[1]
    assert "listops: generated on first use into" in data and "  note: listops: task.generate is set" in data
    monkeypatch.setattr(taskdata, "_NOTED", set())
    exp = resolve("demo/s4d", overrides=[f"task.data_dir={own_files}", f"task.generate={TINY}"])
    taskdata.say_unread_files(exp.task)
    taskdata.say_unread_files(exp.task)  # once per process
    assert capsys.readouterr().err.count("task.generate is set") == 1


def test_loading_generated_data_beside_the_files_says_which_is_read(tmp_path, capsys):
    root = _files(tmp_path, 20)
    exp = resolve("demo/s4d", overrides=[f"task.data_dir={root}", f"task.generate={TINY}"])
    data = taskdata.load_data(exp.task)
    err = capsys.readouterr().err
    assert "task.generate is set" in err and "add task.generate=null and task.train_subset=null" in err
    assert data.info.get("generated", "").startswith(str(root / "generated" / "listops"))
    assert len(data.train) == 4  # 10% of the 40 generated sequences, not of the 20 in the files


def test_the_files_with_the_presets_subset_name_the_subset_as_the_cause(own_files, tmp_path, capsys):
    """A 20-row file with the demo's 10%: 2 examples for a batch of 32."""
    assert (
        main(
            [
                "train",
                "--preset",
                "demo/s4d",
                "--data-dir",
                str(own_files),
                "--out",
                str(tmp_path / "run"),
                "task.generate=null",
                "train.progress=false",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert (
        "train.batch_size 32 is larger than the training set (2 items): task.train_subset kept 2 of its 20 items; "
        "raise task.train_subset (null keeps them all) or lower train.batch_size"
    ) in err
    assert "task.generate is set" not in err
    # without the subset: all 20, and the message is about the batch alone
    from longrange.data.batch import collate
    from longrange.train.sampler import BatchPlan

    exp = resolve("demo/s4d", overrides=[f"task.data_dir={own_files}", "task.generate=null", "task.train_subset=null"])
    with pytest.raises(
        ConfigError,
        match=r"larger than the training set \(20 items\): no complete batch; lower "
        r"train.batch_size$",
    ):
        BatchPlan(taskdata.load_data(exp.task).train, collate, batch_size=32)


def test_data_sets_of_one_task_are_told_apart_by_the_settings_that_differ():
    """Two data sets of one task (a MAD level that changes ``n_train``) each name what sets them apart."""
    from longrange.studies.mad import MadSettings, cell_experiment

    settings = MadSettings(models=("hyena",), tasks=("mad-in-context-recall",), levels=("baseline", "n_train=800"))
    base, fewer = (cell_experiment(settings, "hyena", "mad-in-context-recall", lv, 1e-3, 0.0) for lv in settings.levels)
    lines, missing = C.data_lines([base, fewer])
    assert lines[0].startswith("mad-in-context-recall (n_train default): ") and not missing
    assert lines[1].startswith("mad-in-context-recall (n_train=800): ")
    alone, _ = C.data_lines([fewer])
    assert alone[0].startswith("mad-in-context-recall: ")
