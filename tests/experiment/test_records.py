"""What a run records beside its result (data dir, skipped records, versions, fingerprint), set from
the command line's --data-dir/--skip-bad, and compare's "stage k of n" progress lines."""

from __future__ import annotations

import json

import yaml

from longrange.cli import main


def _listops_with_a_bad_line(root):
    from longrange.data.generate.listops import generate

    folder = root / "listops"
    generate(
        folder,
        n_train=48,
        n_val=16,
        n_test=16,
        min_length=8,
        max_length=24,
        max_depth=3,
        max_args=3,
        seed=0,
        quiet=True,
    )
    with open(folder / "basic_train.tsv", "a") as f:
        f.write("( [MAX 4 ]\tnot-a-label\n")
    return folder


def _config(path, **train):
    path.write_text(
        yaml.safe_dump(
            {
                "label": "tiny",
                "task": {"name": "listops", "options": {"seq_len": 32}},
                "model": dict(
                    block="simple", primitive="s4d", n_layers=1, d_model=8, d_state=4, direction="bidirectional"
                ),
                "train": {"batch_size": 16, "epochs": 1, "lr": 0.003, "progress": False, "log_every": 2, **train},
            }
        )
    )
    return path


def test_train_records_data_dir_skipped_records_and_versions(tmp_path, capsys):
    folder = _listops_with_a_bad_line(tmp_path / "data")
    config = _config(tmp_path / "exp.yaml")
    run = tmp_path / "run"
    # without --skip-bad the bad line stops the run, naming file and line
    assert main(["train", "--config", str(config), "--out", str(run), "--data-dir", str(tmp_path / "data")]) == 1
    assert "basic_train.tsv, line 50" in capsys.readouterr().err
    assert (
        main(
            [
                "train",
                "--config",
                str(config),
                "--data-dir",
                str(tmp_path / "data"),
                "--out",
                str(run),
                "--skip-bad",
                "--overwrite",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["skip_bad"] is True
    assert summary["skipped"] == {str(folder / "basic_train.tsv"): 1}
    assert summary["data_dir"] == str((tmp_path / "data").resolve())
    assert {"longrange", "torch", "python"} <= set(summary["versions"]) and len(summary["fingerprint"]) == 16
    record = yaml.safe_load((run / "config.yaml").read_text())["record"]
    assert record["skipped"] == summary["skipped"] and record["data_dir"] == summary["data_dir"]
    assert yaml.safe_load((run / "config.yaml").read_text())["task"]["data_dir"] == str(tmp_path / "data")


def test_compare_prints_stage_k_of_n_with_an_eta(tmp_path, capsys):
    from longrange.data.generate.listops import generate

    generate(
        tmp_path / "data" / "listops",
        n_train=48,
        n_val=16,
        n_test=16,
        min_length=8,
        max_length=24,
        max_depth=3,
        max_args=3,
        seed=0,
        quiet=True,
    )
    config = _config(tmp_path / "exp.yaml", max_steps=2)
    out = tmp_path / "out"
    argv = [
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
        "--data-dir",
        str(tmp_path / "data"),
        "pretrain.max_steps=2",
    ]
    assert main(argv) == 0
    err = capsys.readouterr().err
    for k in (1, 2, 3):
        assert f"stage {k} of 3: " in err
    assert "eta" in err
    assert main(argv) == 0  # everything reused the second time
    err = capsys.readouterr().err
    assert err.count("reusing") == 3


def test_compare_records_device_precision_and_kernels_and_logs_one_wandb_group(tmp_path, capsys, request):
    from longrange.ops import conv, norm
    from longrange.ops.scan import auto_impl

    tracked = _wandb_available()
    wandb = request.getfixturevalue("wandb_offline") if tracked else None
    from longrange.data.generate.listops import generate

    generate(
        tmp_path / "data" / "listops",
        n_train=48,
        n_val=16,
        n_test=16,
        min_length=8,
        max_length=24,
        max_depth=3,
        max_args=3,
        seed=0,
        quiet=True,
    )
    config = tmp_path / "exp.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "label": "tiny-s6",
                "task": {"name": "listops", "options": {"seq_len": 32}},
                "model": dict(
                    block="mamba", primitive="s6", n_layers=1, d_model=8, d_state=4, direction="bidirectional"
                ),
                "train": {
                    "batch_size": 16,
                    "max_steps": 2,
                    "lr": 0.003,
                    "progress": False,
                    "log_every": 1,
                    "loggers": ["wandb"] if tracked else [],
                },
            }
        )
    )
    out = tmp_path / "grid"
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
                "--data-dir",
                str(tmp_path / "data"),
            ]
        )
        == 0
    )
    capsys.readouterr()
    stages = sorted(p.parent for p in out.rglob("summary.json"))
    assert len(stages) == 3
    for stage in stages:
        summary = json.loads((stage / "summary.json").read_text())
        assert summary["device"]["type"] == "cpu" and summary["device"]["count"] == 1
        assert summary["precision"] == {"autocast": None, "params": "float32"}
        assert summary["kernels"] == {
            "causal_conv1d": conv.auto_impl("cpu"),
            "selective_scan": auto_impl("cpu"),
            "rms_norm": norm.auto_impl("cpu", width=8),  # the block's norm, at width 8
        }
        assert summary["deterministic"] is False and "numba" in summary["versions"]
        record = yaml.safe_load((stage / "config.yaml").read_text())["record"]  # rewritten at the end
        assert {k: record[k] for k in ("device", "precision", "kernels")} == {
            k: summary[k] for k in ("device", "precision", "kernels")
        }
    if tracked:  # one W&B run per stage, named by its stage id, the grid in one group
        runs = wandb.runs()
        assert sorted(r["name"] for r in runs) == sorted(str(s.relative_to(out)) for s in stages)
        assert {r["group"] for r in runs} == {"grid"}
        assert all(r["config"]["record"]["kernels"]["selective_scan"] == auto_impl("cpu") for r in runs)


def _wandb_available() -> bool:
    from longrange import _optional

    return _optional.installed("wandb")


def test_a_resumed_stage_merges_the_kernels_of_the_record_its_earlier_segment_saved():
    from longrange.experiment.record import finish_record
    from longrange.train.rundir.record import RunRecord

    result = {
        "device": {"type": "cpu"},
        "precision": {"autocast": None},
        "deterministic": True,
        "kernels": {"selective_scan": "numba"},
        "step": 3,
    }
    earlier = RunRecord(kernels={"selective_scan": "chunked", "causal_conv1d": "torch"})
    assert finish_record(RunRecord(host="h"), result, earlier).to_json() == {
        "host": "h",
        "device": {"type": "cpu"},
        "precision": {"autocast": None},
        "deterministic": True,
        "kernels": {"causal_conv1d": "torch", "selective_scan": "chunked+numba"},
    }
    assert finish_record(RunRecord(), result, None).kernels == {"selective_scan": "numba"}
