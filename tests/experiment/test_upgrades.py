"""Runs that outlive a release: fields with defaults and the longrange version are not part of a run's
identity, so a grid made before an upgrade is reused and resumed after it."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from tiny_experiment import tiny as tiny_experiment

from longrange import __version__
from longrange.cli import main
from longrange.errors import CheckpointError
from longrange.experiment.compare import compare
from longrange.experiment.config import experiment_from_dict
from longrange.identity import differences, fingerprint
from longrange.train.rundir import Intent, RunDir, RunMismatchError


def tiny(data_dir, **train) -> dict:
    return {
        **tiny_experiment(data_dir, **train),
        "compare": {"objectives": ["masked"], "seeds": [0], "compute_matched": False},
    }


def _edit_yaml(path, change) -> None:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def test_identity_leaves_out_fields_at_their_default():
    from longrange.models.config import ModelConfig
    from longrange.train.config import TrainConfig

    full = {
        "seed": 0,
        "model": ModelConfig(d_model=8).to_dict(),
        "train": TrainConfig(lr=0.003).to_dict(),
        "code": {"longrange": "0.0.1"},
    }
    older = json.loads(json.dumps(full))
    del older["train"]["step_gamma"], older["model"]["attn_bias"]  # fields an older release did not have
    older["code"] = {"longrange": "9.9"}  # the version is not part of the identity
    assert fingerprint(older) == fingerprint(full) and differences(older, full) == []
    changed = json.loads(json.dumps(older))
    changed["train"]["step_gamma"] = 0.5
    assert differences(changed, full) == ["train.step_gamma: 0.5 -> 0.1"]


@pytest.fixture
def finished(tiny_listops_dir, tmp_path):
    exp = experiment_from_dict(tiny(tiny_listops_dir))
    compare([exp], tmp_path, seeds=[0])
    return exp, tmp_path


def test_a_stage_saved_without_a_field_at_its_default_is_reused(finished, capsys):
    exp, out = finished
    for config in out.rglob("config.yaml"):  # as an older release wrote them: no step_gamma, no attn_dropout
        _edit_yaml(config, lambda d: (d["train"].pop("step_gamma"), d["model"].pop("attn_dropout", None)))
    capsys.readouterr()
    compare([exp], out, seeds=[0])
    err = capsys.readouterr().err
    assert err.count("reusing") == 3 and "running" not in err


def test_a_stage_whose_field_differs_from_the_default_is_not_reused(finished):
    exp, out = finished
    _edit_yaml(out / "listops/tiny/scratch/seed0/config.yaml", lambda d: d["train"].__setitem__("step_gamma", 0.5))
    with pytest.raises(RunMismatchError, match=r"listops/tiny/scratch/seed0: train.step_gamma: 0.5 -> 0.1"):
        compare([exp], out, seeds=[0])


def test_stages_of_another_version_are_reused_with_a_line_and_rerun_on_request(finished, capsys):
    exp, out = finished
    for summary in out.rglob("summary.json"):
        data = json.loads(summary.read_text())
        data["versions"]["longrange"] = "0.0.9"
        summary.write_text(json.dumps(data))
    capsys.readouterr()
    compare([exp], out, seeds=[0])
    err = capsys.readouterr().err
    assert "3 of 3 stages were made by longrange 0.0.9" in err and err.count("reusing") == 3
    assert main(["report", str(out), "--no-plots"]) == 0
    assert "3 of 3 runs were made by longrange 0.0.9" in capsys.readouterr().err
    assert "3 of 3 runs were made by longrange 0.0.9" in (out / "report.md").read_text()
    compare([exp], out, seeds=[0], rerun_other_versions=True)
    err = capsys.readouterr().err
    assert err.count("running ") == 3 and "were made by longrange" not in err
    assert {RunDir(p.parent).made_by() for p in out.rglob("summary.json")} == {__version__}


def test_resume_refuses_a_checkpoint_format_it_cannot_read(finished):
    exp, out = finished
    from longrange.experiment.execute import run_stage
    from longrange.experiment.stage import resolve_stage

    run = RunDir(out / "listops/tiny/scratch/seed0")
    state = torch.load(run.last, weights_only=True)
    state["format"], state["longrange"] = 99, "7.0.0"
    torch.save(state, run.last)
    run.summary.unlink()
    with pytest.raises(
        CheckpointError,
        match=rf"checkpoint format 99 \(written by longrange 7.0.0\).*this longrange "
        rf"{__version__} reads formats up to 1",
    ):
        run_stage(resolve_stage(exp, "train"), run.root, Intent("resume"))
