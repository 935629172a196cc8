"""The comparison and the stage commands never reuse or resume a run made with other settings, never
rewrite a finished run, and keep going past a failed stage while reporting it."""

from __future__ import annotations

import json

import pytest

from longrange.cli import main
from longrange.errors import ConfigError
from longrange.experiment.compare import StageFailed, compare, stage_statuses
from longrange.experiment.config import experiment_from_dict
from longrange.experiment.execute import run_stage
from longrange.experiment.plan import Plan, plan_grid
from longrange.experiment.stage import resolve_stage
from longrange.train.rundir import RunMismatchError


def tiny(data_dir, label="tiny", **train) -> dict:
    return {
        "label": label,
        "task": {"name": "listops", "options": {"seq_len": 32}, "data_dir": str(data_dir)},
        "model": dict(block="simple", primitive="s4d", n_layers=1, d_model=8, d_state=4, direction="bidirectional"),
        "train": {"batch_size": 16, "epochs": 1, "lr": 0.003, "progress": False, "log_every": 2, **train},
    }


def test_plan_lists_stages_with_dependencies():
    exps = [experiment_from_dict(tiny("/nonexistent", "a")), experiment_from_dict(tiny("/nonexistent", "b"))]
    plan = plan_grid(exps, seeds=[0, 1], objectives=["masked"])
    assert len(plan.stages) == 2 * 2 * 4
    fine = plan.by_id["listops/a/masked-spt/seed1/finetune"]
    assert fine.after == ["listops/a/masked-spt/seed1/pretrain"] and fine.init_from == fine.after[0]
    matched = plan.by_id["listops/b/scratch-matched/seed0"]
    assert matched.matched_to == [["listops/b/masked-spt/seed0/pretrain", "listops/b/masked-spt/seed0/finetune"]]
    assert [len(level) for level in plan.levels()] == [8, 4, 4]
    assert {s.id for s in plan.dependents("listops/a/masked-spt/seed0/pretrain")} == {
        "listops/a/masked-spt/seed0/finetune",
        "listops/a/scratch-matched/seed0",
    }
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))).to_dict() == plan.to_dict()
    with pytest.raises(ConfigError, match="share the run directory"):
        plan_grid([exps[0], exps[0]], seeds=[0])


def test_compare_refuses_stale_reuse_and_overwrite_reruns(tiny_listops_dir, tmp_path, capsys):
    exp = experiment_from_dict(tiny(tiny_listops_dir))
    first = compare([exp], tmp_path, seeds=[0], objectives=["masked"])
    assert [s["regime"] for s in first] == ["scratch", "masked-spt", "scratch-matched"]
    changed = experiment_from_dict(tiny(tiny_listops_dir, lr=0.01))
    with pytest.raises(
        RunMismatchError, match=r"4 finished stage\(s\) .* other settings: .*train.lr: 0.003 -> 0.01.*--overwrite"
    ):
        compare([changed], tmp_path, seeds=[0], objectives=["masked"])
    again = compare([changed], tmp_path, seeds=[0], objectives=["masked"], overwrite=True)
    assert all(a["fingerprint"] != b["fingerprint"] for a, b in zip(first, again))
    # The same settings are reused as they are (no stage runs again).
    capsys.readouterr()
    assert compare([changed], tmp_path, seeds=[0], objectives=["masked"]) == again
    assert "running" not in capsys.readouterr().err
    assert set(stage_statuses(tmp_path).values()) == {"finished"}


def test_a_failed_stage_is_reported_and_the_rest_of_the_grid_runs(tiny_listops_dir, tmp_path, monkeypatch):
    import longrange.experiment.execute as C

    real = C._train

    def failing(stage, run, **kw):
        if stage.stage == "pretrain":
            raise ValueError("boom")
        return real(stage, run, **kw)

    monkeypatch.setattr(C, "_train", failing)
    exp = experiment_from_dict(tiny(tiny_listops_dir))
    with pytest.raises(
        StageFailed,
        match=r"1 stage\(s\) failed: listops/tiny/masked-spt/seed0/pretrain .*failed.json.*2 stage\(s\) after them",
    ):
        compare([exp], tmp_path, seeds=[0], objectives=["masked"])
    statuses = stage_statuses(tmp_path)
    assert statuses["listops/tiny/scratch/seed0"] == "finished"
    assert statuses["listops/tiny/masked-spt/seed0/pretrain"] == "failed"
    assert statuses["listops/tiny/masked-spt/seed0/finetune"] == "pending"
    failure = json.loads((tmp_path / "listops/tiny/masked-spt/seed0/pretrain/failed.json").read_text())
    assert failure["error"] == "ValueError: boom"
    monkeypatch.setattr(C, "_train", real)
    compare([exp], tmp_path, seeds=[0], objectives=["masked"])  # only the missing work
    assert set(stage_statuses(tmp_path).values()) == {"finished"}


def test_compare_cli_dry_run_and_status(tiny_listops_dir, tmp_path, capsys):
    import yaml

    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(tiny(tiny_listops_dir)))
    assert main(["compare", "--config", str(config), "--out", str(tmp_path / "out"), "--seeds", "0", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "4 stages in 3 dependency levels" in out and "after listops/tiny/masked-spt/seed0/pretrain" in out
    assert not (tmp_path / "out" / "listops").exists()
    assert main(["compare", "--status", str(tmp_path / "out")]) == 1  # no plan yet: a clear error
    assert "holds no comparison" in capsys.readouterr().err


def test_resume_refuses_other_settings_and_never_rewrites_a_finished_run(tiny_listops_dir, tmp_path, capsys):
    import yaml

    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(tiny(tiny_listops_dir)))
    run = str(tmp_path / "run")
    assert main(["train", "--config", str(config), "--out", run, "--seed", "3"]) == 0
    summary = (tmp_path / "run" / "summary.json").read_text()
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--out", run, "--seed", "4", "--resume"]) == 1
    err = capsys.readouterr().err
    assert "cannot resume" in err and "seed: 3 -> 4" in err and "--overwrite" in err
    assert main(["train", "--config", str(config), "--out", run, "--seed", "3", "--resume", "train.epochs=2"]) == 1
    assert "train.epochs: 1 -> 2" in capsys.readouterr().err
    assert main(["train", "--config", str(config), "--out", run, "--seed", "3", "--resume"]) == 0
    assert (tmp_path / "run" / "summary.json").read_text() == summary  # not rewritten (wall time included)
    assert main(["train", "--config", str(config), "--out", run, "--resume", "--overwrite"]) == 1
    assert "--resume and --overwrite contradict" in capsys.readouterr().err
    json.loads(summary)  # valid JSON
    with pytest.raises(
        ConfigError, match=r"already holds a finished run \(its result: .*summary.json\); pass --overwrite"
    ):
        run_stage(resolve_stage(experiment_from_dict(tiny(tiny_listops_dir)), "train", seed=3), run)


def test_a_model_that_cannot_be_built_stops_the_comparison_before_any_stage(tiny_listops_dir, tmp_path):
    """Mamba-2 at width 16 has 32 inner channels, fewer than one head of 64: said when the comparison
    is planned, naming the experiment, not after the stages before it have trained."""
    good = experiment_from_dict(tiny(tiny_listops_dir))
    data = tiny(tiny_listops_dir)
    data["label"] = "mamba2-w16"
    data["model"] = dict(block="residual", primitive="mamba2", n_layers=1, d_model=16, direction="causal")
    with pytest.raises(
        ConfigError, match=r"mamba2-w16: Mamba-2: expand \* d_model = 32 is not divisible by headdim=64"
    ):
        compare([good, experiment_from_dict(data)], tmp_path / "out", seeds=[0], objectives=["masked"])
    assert not (tmp_path / "out" / "listops").exists()
