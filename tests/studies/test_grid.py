"""longrange.studies.grid: a grid of single scratch runs (presets with overrides under labels of
their own, at seeds) as a plan of the comparison's scheduler, and where each run trains."""

from __future__ import annotations

from pathlib import Path

import pytest

from longrange.errors import ConfigError
from longrange.experiment.plan import Plan
from longrange.studies.grid import GridRun, grid_plan, run_dir, run_fingerprint, run_grid

PRESET = "mamba/induction-heads/cpu/{}"


def _runs():
    over = ["task.options.seq_len=24"]
    return [
        GridRun("dlr", PRESET.format("simple-dlr"), "DLR L=24", over, {"seq_len": 24}, seed=0),
        GridRun("dlr", PRESET.format("simple-dlr"), "DLR L=24", over, {"seq_len": 24}, seed=1),
        GridRun("s4d", PRESET.format("simple-s4d"), "S4D L=24", over, {"seq_len": 24}, seed=1),
    ]


def test_the_plan_trains_each_label_from_scratch_at_its_own_seeds_only():
    plan = grid_plan(_runs())
    got = sorted((plan.experiments[s.experiment].label, s.seed, s.regime, s.stage) for s in plan.stages)
    # S4D runs at seed 1 only, though the grid's seeds are 0 and 1; nothing is pretrained
    assert got == [
        ("DLR L=24", 0, "scratch", "train"),
        ("DLR L=24", 1, "scratch", "train"),
        ("S4D L=24", 1, "scratch", "train"),
    ]
    assert all(plan.experiments[s.experiment].task.options["seq_len"] == 24 for s in plan.stages)


def test_a_run_trains_in_its_plan_stage_directory():
    runs = _runs()
    plan = grid_plan(runs)
    ids = {s.id for s in plan.stages}
    for r in runs:
        path = run_dir(Path("out"), r)
        assert path.parts[0] == "out" and str(path.relative_to("out")) in ids


def test_a_preset_that_sweeps_training_subsets_is_refused_naming_it():
    run = GridRun("dlr", "demo/recall/dlr", "DLR", [])  # the recall study's presets sweep 250 and 1,000 labels
    with pytest.raises(ConfigError, match="DLR: demo/recall/dlr sweeps compare.train_subsets"):
        grid_plan([run])
    fixed = GridRun("dlr", "demo/recall/dlr", "DLR", ["compare.train_subsets=[]", "task.train_subset=250"])
    assert len(grid_plan([fixed]).stages) == 1


TOY = [
    "task.options.seq_len=16",
    "task.options.n_train=8",
    "task.options.n_val=4",
    "task.options.n_test=4",
    "train.max_steps=2",
    "train.eval_every=0",
    "train.batch_size=4",
    "model.d_model=8",
]


def _toy_runs():
    return [
        GridRun("dlr", PRESET.format("simple-dlr"), "DLR toy", TOY),
        GridRun("s4d", PRESET.format("simple-s4d"), "S4D toy", TOY),
    ]


def test_follow_length_builds_every_long_filter_for_the_task_length():
    """Hyena's filter and a stack's implicit BaseConv get the run's length; a model without one is
    the preset's; a task without a length is refused, naming the run."""
    over = ["task.options.seq_len=128", "task.options.n_pairs=8"]
    hyena = GridRun("hyena", "zoology/mqar/cpu/hyena", "Hyena L=128", over, follow_length=True).experiment()
    assert hyena.model.primitive_options["l_max"] == 128
    stack = GridRun("bc", "zoology/mqar/cpu/base-conv", "BC L=128", over, follow_length=True).experiment()
    assert stack.model.layers[1]["options"]["l_max"] == 128 and "l_max" not in stack.model.layers[0]["options"]
    assert (
        GridRun("bc", "zoology/mqar/cpu/base-conv", "BC L=128", over).experiment().model.layers[1]["options"]["l_max"]
        == 64
    )  # the preset's, without follow_length
    given = [*over, "model.primitive_options.l_max=256"]  # an l_max the overrides set wins
    assert (
        GridRun("h", "zoology/mqar/cpu/hyena", "H", given, follow_length=True)
        .experiment()
        .model.primitive_options["l_max"]
        == 256
    )
    plain = GridRun("a", "zoology/mqar/cpu/attention", "A", over, follow_length=True).experiment()
    assert plain.to_dict() == GridRun("a", "zoology/mqar/cpu/attention", "A", over).experiment().to_dict()
    with pytest.raises(ConfigError, match="Image: follow_length needs the task's seq_len"):
        GridRun("dlr", "spt/image/dlr-random", "Image", [], follow_length=True).experiment()


def test_the_fingerprint_is_the_runs_settings_and_its_run_directory_records_it(tmp_path):
    runs = _toy_runs()
    assert run_fingerprint(runs[0]) == run_fingerprint(GridRun("x", runs[0].preset, runs[0].label, list(TOY)))
    assert run_fingerprint(runs[0]) != run_fingerprint(
        GridRun("dlr", runs[0].preset, runs[0].label, [*TOY, "train.lr=0.0123"])
    )
    assert run_grid(runs[:1], runs, tmp_path, jobs=1) == []
    from longrange.train.rundir import RunDir

    assert RunDir(run_dir(tmp_path, runs[0])).read_config(required=True)["fingerprint"] == run_fingerprint(runs[0])


def test_a_part_of_the_grid_trains_and_the_whole_plan_is_saved(tmp_path):
    runs = _toy_runs()
    assert run_grid(runs[:1], runs, tmp_path, jobs=1) == []
    assert (run_dir(tmp_path, runs[0]) / "summary.json").is_file()
    assert not run_dir(tmp_path, runs[1]).exists()  # the other part is not trained
    saved = Plan.load(tmp_path)  # but the plan on disk is the whole grid's
    assert [s.id for s in saved.stages] == [s.id for s in grid_plan(runs).stages]


def test_a_run_that_fails_is_returned_not_raised_and_the_others_finish(tmp_path):
    runs = _toy_runs()
    runs[1].overrides = [*TOY, "train.lr=1e30"]  # diverges: an error of its run, not a number
    unfinished = run_grid(runs, runs, tmp_path, jobs=1)
    assert unfinished == [str(run_dir(tmp_path, runs[1]).relative_to(tmp_path))]
    assert "diverge" in (run_dir(tmp_path, runs[1]) / "failed.json").read_text().lower()
    assert (run_dir(tmp_path, runs[0]) / "summary.json").is_file()
