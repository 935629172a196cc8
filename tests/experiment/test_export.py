"""``compare --export``: a comparison's results without what can be made again, from which the
comparison continues."""

from __future__ import annotations

import json

import pytest

from longrange.cli import main
from longrange.errors import ConfigError
from longrange.experiment.compare import StageFailed, compare, stage_statuses
from longrange.experiment.config import experiment_from_dict
from longrange.experiment.export import export_results

PRE, FINE = "listops/tiny/masked-spt/seed0/pretrain", "listops/tiny/masked-spt/seed0/finetune"
SCRATCH, MATCHED = "listops/tiny/scratch/seed0", "listops/tiny/scratch-matched/seed0"


def tiny(data_dir) -> dict:
    return {
        "label": "tiny",
        "task": {"name": "listops", "options": {"seq_len": 32}, "data_dir": str(data_dir)},
        "model": dict(block="simple", primitive="s4d", n_layers=1, d_model=8, d_state=4, direction="bidirectional"),
        "train": {"batch_size": 16, "max_steps": 3, "lr": 0.003, "progress": False, "log_every": 1},
    }


def _files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_an_export_keeps_records_and_needed_weights_and_the_comparison_continues_from_it(
    tiny_listops_dir, tmp_path, monkeypatch, capsys
):
    import longrange.experiment.execute as C

    real = C._train

    def failing(stage, run, **kw):
        if stage.stage == "finetune":
            raise ValueError("boom")
        return real(stage, run, **kw)

    monkeypatch.setattr(C, "_train", failing)
    exp = experiment_from_dict(tiny(tiny_listops_dir))
    out, dest = tmp_path / "out", tmp_path / "kept" / "study"
    with pytest.raises(StageFailed):
        compare([exp], out, seeds=[0], objectives=["masked"])
    assert stage_statuses(out) == {SCRATCH: "finished", PRE: "finished", FINE: "failed", MATCHED: "pending"}
    (out / "report.md").write_text("a study's own file")

    assert main(["compare", "--export", str(out), str(dest)]) == 0
    said = capsys.readouterr().out
    assert "2 finished stage(s)" in said and "2 unfinished stage(s) left out" in said and PRE in said
    files = _files(dest)
    assert "plan.json" in files and "report.md" in files
    for sid in (SCRATCH, PRE):  # finished: the record, no events, no checkpoint to resume from
        assert {f"{sid}/config.yaml", f"{sid}/summary.json", f"{sid}/metrics.jsonl"} <= set(files)
        assert not any(f.startswith(f"{sid}/tensorboard") or f.endswith("last.pt") for f in files)
    assert f"{PRE}/checkpoints/best.safetensors" in files  # the finetuning starts from it
    assert not any(f.startswith(f"{SCRATCH}/checkpoints") for f in files)
    assert not any(f.startswith((FINE, MATCHED)) for f in files)  # unfinished: run again from the copy
    assert (dest / SCRATCH / "summary.json").read_bytes() == (out / SCRATCH / "summary.json").read_bytes()

    # The comparison continues from the copy: the finished stages reused, the rest run.
    monkeypatch.setattr(C, "_train", real)
    compare([exp], dest, seeds=[0], objectives=["masked"])
    assert set(stage_statuses(dest).values()) == {"finished"}
    err = capsys.readouterr().err
    assert f"reusing {SCRATCH}" in err and f"reusing {PRE}" in err
    assert json.loads((dest / SCRATCH / "summary.json").read_text()) == json.loads(
        (out / SCRATCH / "summary.json").read_text()
    )

    # Exported again, whole: no stage needs the pretraining's weights now, and they go.
    again = tmp_path / "again"
    assert main(["compare", "--export", str(dest), str(again)]) == 0
    assert not any("checkpoints" in f for f in _files(again))
    assert main(["compare", "--export", str(again), str(dest)]) == 0  # over an earlier export: replaced whole
    assert _files(dest) == _files(again) and not list(dest.parent.glob(".*export*"))


def test_export_errors_name_the_folder(tmp_path, capsys):
    with pytest.raises(ConfigError, match="holds no comparison"):
        export_results(tmp_path / "nothing", tmp_path / "dest")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "plan.json").write_text(json.dumps({"experiments": [], "stages": []}))
    with pytest.raises(ConfigError, match="one holds the other"):
        export_results(tmp_path / "out", tmp_path / "out" / "inside")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is not a folder"):
        export_results(tmp_path / "out", tmp_path / "file")
    assert main(["compare", "--export", str(tmp_path / "nothing"), str(tmp_path / "d")]) == 1
    assert "holds no comparison" in capsys.readouterr().err
