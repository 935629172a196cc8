"""A comparison's cells: presets x configs x swept values, labelled, run, reused and resumed as any
stage; each cell's size printed, differences over 10% warned about, widths matched on request."""

from __future__ import annotations

import importlib

import pytest

from longrange.cli import main
from longrange.errors import ConfigError
from longrange.experiment.cells import model_groups, named_cells, split_top_level, sweeps
from longrange.experiment.params import model_size

C = importlib.import_module("longrange.experiment.compare")

TINY = [
    "task.generate={config: short, n_train: 32, n_val: 8, n_test: 8, min_length: 8, max_length: 32, "
    "max_depth: 3, max_args: 3}",
    "task.options.seq_len=32",
    "task.train_subset=null",
    "train.batch_size=16",
    "train.epochs=1",
    "pretrain.epochs=1",
    "model.n_layers=1",
    "model.d_state=4",
    "train.progress=false",
]


def test_values_split_at_top_level_commas_only():
    assert split_top_level("36,64") == ["36", "64"]
    assert split_top_level("[0,1]") == ["[0,1]"] and split_top_level("{a: 1, b: [2, 3]},x") == [
        "{a: 1, b: [2, 3]}",
        "x",
    ]
    assert split_top_level("'a,b',c") == ["'a,b'", "c"] and split_top_level("3e-4") == ["3e-4"]
    fixed, swept = sweeps(["model.d_model=36,64", "train.lr=3e-4", "compare.objectives=[causal,masked]"])
    assert fixed == ["train.lr=3e-4", "compare.objectives=[causal,masked]"] and swept == [
        ("model.d_model", ["36", "64"])
    ]
    with pytest.raises(ConfigError, match=r"compare.seeds says how the grid runs.*cannot be swept"):
        sweeps(["compare.seeds=0,1"])
    with pytest.raises(ConfigError, match=r"an empty value in the sweep of model.d_model"):
        sweeps(["model.d_model=36,"])


def test_cells_are_every_combination_labelled_by_what_varies(tmp_path):
    wide, deep = tmp_path / "wide.yaml", tmp_path / "deep.yaml"
    wide.write_text("model: {d_model: 96}\n")
    deep.write_text("model: {n_layers: 3}\n")
    found = named_cells(["demo/s4d", "demo/transformer"], [wide, deep], ["model.d_state=8,16", "train.lr=0.001"])
    assert [c.exp.label for c in found] == [
        "S4D (wide, d_state=8)",
        "S4D (wide, d_state=16)",
        "S4D (deep, d_state=8)",
        "S4D (deep, d_state=16)",
        "Transformer (wide, d_state=8)",
        "Transformer (wide, d_state=16)",
        "Transformer (deep, d_state=8)",
        "Transformer (deep, d_state=16)",
    ]
    assert [c.exp.model.d_state for c in found[:2]] == [8, 16] and found[2].exp.model.n_layers == 3
    assert all(c.exp.train["lr"] == 0.001 for c in found)
    assert model_groups(found) == [[0, 2, 4, 6], [1, 3, 5, 7]]  # the models compared at each swept value
    # one config (as before): no name of it in the label; configs alone: each its own experiment
    assert [c.exp.label for c in named_cells(["demo/s4d"], [wide], [])] == ["S4D"]
    own = tmp_path / "own.yaml"
    own.write_text("base: demo/dlr\nlabel: Mine\n")
    assert [c.exp.label for c in named_cells([], [own, wide], [])] == ["Mine", "mamba-s6"]  # the default model
    assert [c.exp.label for c in named_cells([str(own)], [], ["model.d_model=8,16"])] == [
        "Mine (d_model=8)",
        "Mine (d_model=16)",
    ]
    with pytest.raises(ConfigError, match=r"config file .*nowhere.yaml does not exist"):
        named_cells(["nowhere.yaml"], [], [])


def test_compare_plans_a_sweep_and_prints_each_cells_size(tmp_path, capsys):
    assert (
        main(
            [
                "compare",
                "--preset",
                "demo/s4d",
                "--preset",
                "demo/transformer",
                "--out",
                str(tmp_path / "o"),
                "--dry-run",
                "--seeds",
                "0",
                "--data-dir",
                str(tmp_path / "d"),
                "model.d_model=32,64",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    for label in ("S4D-d_model-32", "S4D-d_model-64", "Transformer-d_model-32", "Transformer-d_model-64"):
        assert f"  listops/{label}/scratch/seed0  [train; 30 epochs, lr 0.002 (cosine), batch 32]" in out
    sizes = {
        d: {
            p: int(model_size(c.exp)["total"])
            for p, c in zip(("s4d", "tr"), named_cells(["demo/s4d", "demo/transformer"], [], [f"model.d_model={d}"]))
        }
        for d in (32, 64)
    }
    assert (
        f"parameters: S4D (d_model=32) {sizes[32]['s4d']:,}, S4D (d_model=64) {sizes[64]['s4d']:,}, "
        f"Transformer (d_model=32) {sizes[32]['tr']:,}, Transformer (d_model=64) {sizes[64]['tr']:,}"
    ) in out
    # the models of one width are compared with each other, not across the widths of the sweep
    assert (
        f"warning: the compared models differ in size by more than 10%: Transformer (d_model=64) has "
        f"{sizes[64]['tr'] / sizes[64]['s4d']:.2f}x the parameters of S4D (d_model=64)"
    ) in out
    assert "Transformer (d_model=64) has" in out and "(d_model=32) has" in out and out.count("warning:") == 2


def test_match_params_adjusts_each_width_to_the_first(tmp_path, capsys):
    assert (
        main(
            [
                "compare",
                "--preset",
                "demo/transformer",
                "--preset",
                "demo/s4d",
                "--out",
                str(tmp_path / "o"),
                "--dry-run",
                "--seeds",
                "0",
                "--data-dir",
                str(tmp_path / "d"),
                "--match-params",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    target = int(model_size(named_cells(["demo/transformer"])[0].exp)["total"])
    line = next(x for x in out.splitlines() if x.startswith("matched to Transformer: S4D: model.d_model 64 -> "))
    width = int(line.split(" -> ")[1].split(":")[0])
    matched = int(model_size(named_cells(["demo/s4d"], [], [f"model.d_model={width}"])[0].exp)["total"])
    assert abs(matched / target - 1) < 0.01 and "warning" not in out
    assert f"parameters: Transformer {target:,}, S4D {matched:,}" in out
    assert (
        main(
            [
                "compare",
                "--preset",
                "demo/transformer",
                "--preset",
                "demo/s4d",
                "--out",
                str(tmp_path / "o"),
                "--dry-run",
                "--match-params",
                "model.d_model=32,64",
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "--match-params sets model.d_model of every model after the first" in err
    assert "sweep another field (e.g. model.n_layers=2,4" in err


def test_a_sweep_runs_each_cell_in_one_report_reused_and_resumed_like_any_stage(tmp_path, capsys):
    args = [
        "compare",
        "--preset",
        "demo/s4d",
        "--out",
        str(tmp_path / "o"),
        "--seeds",
        "0",
        "--no-compute-matched",
        "--data-dir",
        str(tmp_path / "d"),
        "model.d_model=8,12",
        *TINY,
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "| S4D (d_model=8) |" in out and "| S4D (d_model=8) + masked SPT |" in out and "| S4D (d_model=12) |" in out
    report = (tmp_path / "o" / "report.md").read_text()
    assert "S4D (d_model=12) + masked SPT" in report
    finetune = tmp_path / "o" / "listops" / "S4D-d_model-12" / "masked-spt" / "seed0" / "finetune"
    (finetune / "summary.json").unlink()  # as if stopped before it finished: rerunning resumes only it
    assert main(args) == 0
    err = capsys.readouterr().err
    assert err.count(": reusing listops/S4D-d_model-") == 5 and "running " + str(finetune) in err.replace(
        "resuming", "running"
    )
