"""Data-fraction sweeps in the comparison: each training subset is a dimension of the plan, and every
stage under it (pretraining included) trains on the same subset of examples."""

from __future__ import annotations

import json

import pytest
import yaml

from longrange.cli import main
from longrange.errors import ConfigError
from longrange.experiment.cli import parse_train_subsets
from longrange.experiment.config import experiment_from_dict, resolve
from longrange.experiment.plan import Plan, plan_grid
from longrange.experiment.taskdata import load_data


def tiny(data_dir, label="tiny", **extra) -> dict:
    return {
        "label": label,
        "task": {"name": "listops", "options": {"seq_len": 32}, "data_dir": str(data_dir)},
        "model": dict(block="simple", primitive="s4d", n_layers=1, d_model=8, d_state=4, direction="bidirectional"),
        "train": {"batch_size": 16, "epochs": 1, "lr": 0.003, "progress": False, "log_every": 2},
        **extra,
    }


def test_plan_expands_subsets_into_ids_dependencies_and_task_configs(tiny_listops_dir, tmp_path):
    exp = experiment_from_dict(tiny(tiny_listops_dir, pretrain_task={"skip_bad": True}))
    plan = plan_grid([exp], seeds=[0], objectives=["masked"], train_subsets=[0.25, 16])
    ids = [s.id for s in plan.stages]
    assert ids == [
        f"listops/tiny/subset{sub}/{rest}"
        for sub in ("0.25", "16")
        for rest in ("scratch/seed0", "masked-spt/seed0/pretrain", "masked-spt/seed0/finetune", "scratch-matched/seed0")
    ]
    fine = plan.by_id["listops/tiny/subset16/masked-spt/seed0/finetune"]
    assert fine.after == ["listops/tiny/subset16/masked-spt/seed0/pretrain"] == [fine.init_from]
    assert plan.by_id["listops/tiny/subset0.25/scratch-matched/seed0"].matched_to == [
        ["listops/tiny/subset0.25/masked-spt/seed0/pretrain", "listops/tiny/subset0.25/masked-spt/seed0/finetune"]
    ]
    # The subset is in every stage's task config (pretraining too, through pretrain_task) and fingerprint.
    done = {i: {"steps": 4} for i in ids}
    fingerprints = {}
    for s in plan.stages:
        if s.stage == "finetune":  # needs a finished pretraining run: checked below through the runs
            continue
        stage_plan = plan.resolve(s, tmp_path, done)
        assert stage_plan.config()["task"]["train_subset"] == s.train_subset and type(s.train_subset) in (float, int)
        if s.stage == "pretrain":
            assert stage_plan.task.skip_bad  # the pretrain_task override is kept, and so is the subset
        fingerprints[s.id] = stage_plan.fingerprint()
    assert fingerprints["listops/tiny/subset0.25/scratch/seed0"] != fingerprints["listops/tiny/subset16/scratch/seed0"]
    # plan.json keeps a fraction a fraction and a count a count.
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert [s.train_subset for s in again.stages] == [0.25] * 4 + [16] * 4
    assert type(again.stages[4].train_subset) is int


def test_without_a_sweep_the_layout_is_unchanged_and_the_config_sweeps(tiny_listops_dir):
    plain = plan_grid([experiment_from_dict(tiny(tiny_listops_dir))], seeds=[0], objectives=["masked"])
    assert [s.id for s in plain.stages][:1] == ["listops/tiny/scratch/seed0"]
    assert all(s.train_subset is None for s in plain.stages)
    exp = resolve(
        None,
        None,
        [
            f"task.data_dir={tiny_listops_dir}",
            "label=x",
            "model.block=simple",
            "compare.train_subsets=[0.5, 1.0, 10]",
            "compare.compute_matched=false",
        ],
    )
    assert exp.compare.train_subsets == [0.5, 1.0, 10] and type(exp.compare.train_subsets[1]) is float
    plan = plan_grid([exp], seeds=[1])
    assert {s.id.split("/")[2] for s in plan.stages} == {"subset0.5", "subset1.0", "subset10"}
    # The command line's --train-subsets replaces the config's list.
    assert {s.train_subset for s in plan_grid([exp], seeds=[1], train_subsets=[0.1]).stages} == {0.1}


@pytest.mark.parametrize(
    "subsets, message",
    [
        ([1.5], r"--train-subsets: the fraction 1.5 is not in \(0, 1\]"),
        ([0], "--train-subsets: the count 0 is not >= 1"),
        ([0.1, 0.1], "0.1 is given twice"),
        ([True], "True is not a fraction"),
    ],
)
def test_bad_subsets_are_one_line_errors(subsets, message):
    exp = experiment_from_dict(tiny("/nonexistent"))
    with pytest.raises(ConfigError, match=message):
        plan_grid([exp], seeds=[0], train_subsets=subsets)


def test_config_errors_and_pretraining_that_would_not_follow_the_subset():
    with pytest.raises(ConfigError, match="compare.train_subsets: the fraction 2.0"):
        experiment_from_dict(tiny("/nonexistent", compare={"train_subsets": [2.0]}))
    with pytest.raises(ConfigError, match="compare.train_subsets"):
        experiment_from_dict(tiny("/nonexistent", compare={"train_subsets": ["half"]}))
    for override in ({"train_subset": 0.5}, {"seed": 3}):
        exp = experiment_from_dict(tiny("/nonexistent", pretrain_task=override))
        with pytest.raises(ConfigError, match=f"pretrain_task.{next(iter(override))} is set"):
            plan_grid([exp], seeds=[0], train_subsets=[0.5])
        plan_grid([exp], seeds=[0])  # without a sweep it is the user's choice
    plan_grid([experiment_from_dict(tiny("/nonexistent", pretrain_task={"seed": 0}))], seeds=[0], train_subsets=[0.5])


def test_parse_train_subsets():
    assert parse_train_subsets("0.05,0.1, 1.0,500,1e-2") == [0.05, 0.1, 1.0, 500, 0.01]
    assert [type(v) for v in parse_train_subsets("1.0,1")] == [float, int]
    assert parse_train_subsets(None) is None
    with pytest.raises(ConfigError, match="--train-subsets must be comma-separated .* got 'half'"):
        parse_train_subsets("0.1,half")


def test_pretraining_and_finetuning_see_the_same_examples(tiny_listops_dir, tmp_path):
    exp = experiment_from_dict(tiny(tiny_listops_dir, pretrain_task={"skip_bad": True}))
    plan = plan_grid([exp], seeds=[0, 1], objectives=["masked"], train_subsets=[0.25])
    train_sets = []
    for s in plan.stages:
        if s.stage == "finetune":
            continue
        data = load_data(plan.resolve(s, tmp_path, {i: {"steps": 1} for i in s.after}).task)
        train_sets.append(list(data.train.indices))
    assert len(train_sets[0]) == 16 and all(t == train_sets[0] for t in train_sets)


def test_a_tiny_sweep_end_to_end(tiny_listops_dir, tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny(tiny_listops_dir)))
    out = tmp_path / "out"
    assert (
        main(
            [
                "compare",
                "--config",
                str(config),
                "--out",
                str(out),
                "--seeds",
                "0",
                "--objectives",
                "masked",
                "--no-compute-matched",
                "--train-subsets",
                "0.5,16",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    for sub, size in (("0.5", 32), ("16", 16)):
        for stage in ("scratch/seed0", "masked-spt/seed0/pretrain", "masked-spt/seed0/finetune"):
            summary = json.loads((out / f"listops/tiny/subset{sub}/{stage}/summary.json").read_text())
            assert summary["train_size"] == size and str(summary["train_subset"]) == sub
            config = yaml.safe_load((out / f"listops/tiny/subset{sub}/{stage}/config.yaml").read_text())
            assert str(config["task"]["train_subset"]) == sub and config["record"]["train_size"] == size
    assert "| Model | 16 examples (n_train=16) | 0.5 (n_train=32) |" in printed
    assert (
        "tiny + masked SPT vs tiny on listops, train subset 16: cannot tell from one seed (SPT − scratch = " in printed
    )
    report = (out / "report.md").read_text()
    assert "## Verdict" in report and "![metric against the training subset](sweep.png)" in report
    assert (out / "sweep.png").is_file()
