"""A comparison on generated data needs no step of its own; missing data that cannot be generated is
named (file and how to get it) by ``--dry-run`` and stops ``compare`` before any stage runs."""

from __future__ import annotations

import importlib

import pytest

from longrange.cli import main
from longrange.errors import DataMissingError
from longrange.experiment.config import experiment_from_dict, resolve

C = importlib.import_module("longrange.experiment.compare")  # the module (the package exports its function)

TINY = "{config: short, n_train: 40, n_val: 8, n_test: 8, min_length: 8, max_length: 32, max_depth: 3, max_args: 3}"


def test_the_readme_comparison_plans_with_its_data_generated_on_first_use(tmp_path, capsys, monkeypatch):
    """README: ``longrange compare --preset demo/transformer --preset demo/s4d --out runs/cmp --jobs 2``."""
    monkeypatch.chdir(tmp_path)
    assert (
        main(
            [
                "compare",
                "--preset",
                "demo/transformer",
                "--preset",
                "demo/s4d",
                "--out",
                "runs/cmp",
                "--jobs",
                "2",
                "--dry-run",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "data:\n  listops: generated on first use into data/generated/listops/short-" in out
    assert not (tmp_path / "data").exists()  # a dry run builds nothing


def test_dry_run_names_missing_data_and_how_to_get_it(tmp_path, capsys):
    assert (
        main(
            [
                "compare",
                "--preset",
                "spt/listops/s4",
                "--out",
                str(tmp_path / "out"),
                "--dry-run",
                "--data-dir",
                str(tmp_path / "none"),
            ]
        )
        == 1
    )
    captured = capsys.readouterr()
    missing = tmp_path / "none" / "listops" / "basic_train.tsv"
    assert f"listops: MISSING {missing}; " in captured.out
    assert "`longrange data generate listops --out <data_dir>/listops`" in captured.out  # the command that builds it
    assert "task.generate=default" in captured.out
    assert "error: the data of 1 task(s) is missing (see 'data:' above)" in captured.err


def test_compare_stops_before_any_stage_when_data_is_missing(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(C, "run_plan", lambda *a, **k: ran.append(a))
    exp = resolve("demo/s4d", overrides=["task.generate=null", f"task.data_dir={tmp_path / 'none'}"])
    with pytest.raises(DataMissingError, match=r"nothing was run: listops: MISSING .*none/listops/basic_train.tsv"):
        C.compare([exp], tmp_path / "out", seeds=[0])
    assert not ran and not (tmp_path / "out").exists()


def test_compare_builds_generated_data_once_before_the_stages_start(tmp_path, monkeypatch):
    """Built in the comparing process, so that worker processes never build it at the same time."""
    seen = []

    def run_plan(plan, out_dir, backend, intent):
        seen.append(sorted(p.name for p in (tmp_path / "data" / "generated" / "listops").iterdir()))
        raise KeyboardInterrupt

    monkeypatch.setattr(C, "run_plan", run_plan)
    exps = [
        resolve(p, overrides=[f"task.generate={TINY}", f"task.data_dir={tmp_path / 'data'}"])
        for p in ("demo/s4d", "demo/transformer")
    ]
    with pytest.raises(KeyboardInterrupt):
        C.compare(exps, tmp_path / "out", seeds=[0])
    assert len(seen) == 1 and len(seen[0]) == 1 and seen[0][0].startswith("short-")


def test_a_comparison_on_generated_data_runs_and_is_reused(tmp_path, capsys):
    exp = experiment_from_dict(
        {
            "label": "tiny",
            "task": {
                "name": "listops",
                "options": {"seq_len": 32},
                "data_dir": str(tmp_path / "data"),
                "generate": {
                    "config": "short",
                    "n_train": 40,
                    "n_val": 8,
                    "n_test": 8,
                    "min_length": 8,
                    "max_length": 32,
                    "max_depth": 3,
                    "max_args": 3,
                },
            },
            "model": dict(block="simple", primitive="s4d", n_layers=1, d_model=8, d_state=4, direction="bidirectional"),
            "train": {"batch_size": 16, "epochs": 1, "progress": False, "log_every": 2},
        }
    )
    first = C.compare([exp], tmp_path / "out", seeds=[0], objectives=["masked"], compute_matched=False)
    assert len(first) == 2
    assert "generating listops data 'short'" in capsys.readouterr().err
    again = C.compare([exp], tmp_path / "out", seeds=[0], objectives=["masked"], compute_matched=False)
    assert again == first  # reused: same data identity, nothing generated or trained again
    assert "generating" not in capsys.readouterr().err
