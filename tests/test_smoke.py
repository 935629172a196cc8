"""LONGRANGE_SMOKE=1 (``longrange.smoke``): the same commands with less work, and a smoke run never
passes for a real one."""

from __future__ import annotations

import pytest

from longrange import smoke
from longrange.cli import main
from longrange.data.generated import generated_configuration as _generated
from longrange.data.tasks import data_identity, load_task
from longrange.errors import ConfigError
from longrange.experiment.config import resolve
from longrange.experiment.plan import plan_grid
from longrange.experiment.stage import resolve_stage


@pytest.fixture
def on(monkeypatch):
    monkeypatch.setenv(smoke.ENV, "1")


@pytest.mark.parametrize("value, expected", [(None, False), ("", False), ("0", False), ("1", True), (" 1 ", True)])
def test_the_variable_turns_it_on(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(smoke.ENV, raising=False)
    else:
        monkeypatch.setenv(smoke.ENV, value)
    assert smoke.active() is expected


@pytest.mark.parametrize("value", ["yes", "2", "true"])
def test_another_value_is_an_error_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(smoke.ENV, value)
    with pytest.raises(ConfigError, match=f"environment variable LONGRANGE_SMOKE must be 1 .* got '{value}'"):
        smoke.active()


def test_off_nothing_changes(monkeypatch):
    monkeypatch.delenv(smoke.ENV, raising=False)
    assert smoke.train_changes({"max_steps": 0, "batch_size": 512, "grad_accum": 4}) == {}
    assert smoke.seeds([0, 1, 2, 3]) == [0, 1, 2, 3]
    assert smoke.eval_size(5000) == 5000
    assert smoke.generated_sizes({"n_train": 96000, "n_samples": 1000}) == {"n_train": 96000, "n_samples": 1000}


def test_the_caps(on, capsys):
    assert smoke.train_changes({"max_steps": 0, "batch_size": 512, "grad_accum": 4, "eval_batch_size": 0}) == {
        "max_steps": smoke.MAX_STEPS,
        "batch_size": smoke.MAX_BATCH,
        "grad_accum": 1,
        "eval_batch_size": smoke.MAX_EVAL,
    }
    assert (
        smoke.train_changes(
            {
                "max_steps": 1,
                "batch_size": 4,
                "grad_accum": 2,  # already small
                "eval_batch_size": smoke.MAX_EVAL,
            }
        )
        == {}
    )
    assert smoke.seeds([3, 4, 5]) == [3][: smoke.MAX_SEEDS]
    assert smoke.eval_size(5000) == smoke.MAX_EVAL and smoke.eval_size(10) == 10
    assert smoke.generated_sizes({"n_train": 96000, "n_val": 10, "n_samples": 1000, "min_length": 500}) == {
        "n_train": smoke.MAX_GENERATED_TRAIN,
        "n_val": 10,
        "n_samples": smoke.MAX_GENERATED_IMAGES,
        "min_length": 500,
    }
    assert smoke.ENV in capsys.readouterr().err  # said on standard error


def test_a_stage_trains_a_few_small_steps_and_the_matched_stage_keeps_its_length(on):
    exp = resolve("demo/dlr", overrides=["train.grad_accum=2"])
    train = resolve_stage(exp, "train").train
    assert (train.max_steps, train.batch_size, train.grad_accum, train.eval_batch_size) == (
        smoke.MAX_STEPS,
        smoke.MAX_BATCH,
        1,
        smoke.MAX_EVAL,
    )
    pre = resolve_stage(exp, "pretrain", objective="masked").train
    assert (pre.max_steps, pre.batch_size) == (smoke.MAX_STEPS, smoke.MAX_BATCH)
    matched = resolve_stage(exp, "train", max_steps=2 * smoke.MAX_STEPS).train
    assert (matched.max_steps, matched.batch_size) == (2 * smoke.MAX_STEPS, smoke.MAX_BATCH)


def test_a_smoke_stage_has_another_fingerprint(monkeypatch, tmp_path):
    exp = resolve("demo/dlr", overrides=[f"task.data_dir={tmp_path}"])
    monkeypatch.delenv(smoke.ENV, raising=False)
    real = resolve_stage(exp, "train").config()
    monkeypatch.setenv(smoke.ENV, "1")
    shrunk = resolve_stage(exp, "train").config()
    assert shrunk["data"]["smoke"] == smoke.IDENTITY and "smoke" not in real["data"]
    assert shrunk["data"]["generated"] != real["data"]["generated"]  # smaller generated data, its own directory
    # even at the settings smoke mode would give, the shortened evaluation splits tell the runs apart
    monkeypatch.delenv(smoke.ENV, raising=False)
    small = resolve_stage(
        resolve(
            "demo/dlr",
            overrides=[
                f"task.data_dir={tmp_path}",
                f"train.max_steps={smoke.MAX_STEPS}",
                f"train.batch_size={smoke.MAX_BATCH}",
                f"train.eval_batch_size={smoke.MAX_EVAL}",
            ],
        ),
        "train",
    ).config()
    assert small["train"] == shrunk["train"] and small["data"] != shrunk["data"]


def test_a_comparison_runs_the_first_seeds(on):
    plan = plan_grid([resolve("demo/dlr")], seeds=[4, 5, 6])
    assert sorted({s.seed for s in plan.stages}) == [4, 5, 6][: smoke.MAX_SEEDS]
    assert sorted({s.seed for s in plan_grid([resolve("demo/dlr")]).stages}) == [0, 1, 2, 3, 4][: smoke.MAX_SEEDS]


def test_evaluation_splits_are_cut_and_generated_data_is_small(on, tmp_path):
    data = load_task("mqar", seq_len=32, n_pairs=2, vocab_size=64, n_train=500, n_val=100, n_test=20)
    assert (len(data.train), len(data.val), len(data.test)) == (500, smoke.MAX_EVAL, 20)
    assert data_identity("mqar", seq_len=32)["smoke"] == smoke.IDENTITY
    _, _, options = _generated("listops", "short", {})
    assert (options["n_train"], options["n_val"], options["n_test"]) == (
        smoke.MAX_GENERATED_TRAIN,
        smoke.MAX_EVAL,
        smoke.MAX_EVAL,
    )


def test_the_first_examples_are_kept(on, monkeypatch):
    shrunk = load_task("mqar", seq_len=32, n_pairs=2, vocab_size=64, n_val=100)
    monkeypatch.delenv(smoke.ENV)
    whole = load_task("mqar", seq_len=32, n_pairs=2, vocab_size=64, n_val=100)
    assert len(whole.val) == 100
    for i in (0, smoke.MAX_EVAL - 1):
        assert shrunk.val[i]["inputs"].tolist() == whole.val[i]["inputs"].tolist()


def test_data_generate_writes_fewer_examples(on, tmp_path, capsys):
    assert (
        main(
            [
                "data",
                "generate",
                "listops",
                "--out",
                str(tmp_path / "lo"),
                "--min-length",
                "32",
                "--max-length",
                "128",
                "--quiet",
            ]
        )
        == 0
    )
    lines = (tmp_path / "lo" / "basic_test.tsv").read_text().splitlines()
    assert len(lines) == 1 + smoke.MAX_EVAL  # the header and the examples
    assert f"listops: {smoke.MAX_GENERATED_TRAIN + 2 * smoke.MAX_EVAL} samples" in capsys.readouterr().out
