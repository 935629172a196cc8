"""The training loop on a toy task: learning, early stopping, accumulation, evaluation, run files."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import yaml
from toy import ToyObjective, toy_setup

from longrange.data.batch import collate
from longrange.errors import ConfigError
from longrange.train import Trainer, load_checkpoint, load_weights, train
from longrange.train.logging import read_metrics
from longrange.train.rundir import RunMismatchError
from longrange.train.sampler import ShardedBatchSampler, epoch_permutation, eval_shards

FAST = {"batch_size": 8, "epochs": 2, "lr": 0.01, "progress": False, "log_every": 2}


def _trainer(tmp_path, name="run", cfg=None, dtype=torch.float32, dropout=0.0, objective=None, **kw):
    model, tr, va, te = toy_setup(dropout=dropout, dtype=dtype)
    kw.setdefault("test_set", te)
    return Trainer(
        model,
        objective or ToyObjective(),
        tr,
        va,
        collate,
        {**FAST, **(cfg or {})},
        tmp_path / name,
        tensorboard=False,
        **kw,
    )


def test_toy_task_learns_and_writes_the_run(tmp_path):
    trainer = _trainer(
        tmp_path,
        cfg={"epochs": 8, "lr": 0.03, "log_every": 6},
        extra_config={"model": {"d": 16, "dims": (1, 2)}, "task": "toy"},
    )
    summary = trainer.fit()
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    train_losses = [r["metrics"]["loss"] for r in records if r["split"] == "train"]
    assert len(train_losses) == 8 and train_losses[-1] < 0.7 * train_losses[0]
    assert summary["best"]["value"] >= 0.75 and summary["test"]["accuracy"] >= 0.7
    assert set(records[0]) == {"step", "epoch", "split", "metrics", "lr", "elapsed"}
    assert [r["step"] for r in records if r["split"] == "val"] == [6 * k for k in range(1, 9)]
    assert records[-1]["split"] == "test" and records[-1]["metrics"] == summary["test"]
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["model"] == {"d": 16, "dims": [1, 2]} and config["task"] == "toy"
    assert config["train"]["lr"] == 0.03 and config["train"]["betas"] == [0.9, 0.999]
    # best.safetensors holds the weights of the best evaluation (weights only); the model is left
    # holding them, and last.pt records which step that was.
    assert not (tmp_path / "run" / "checkpoints" / "best.pt").exists()
    last = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert last["trainer"]["best_step"] == summary["best"]["step"] <= last["trainer"]["step"]
    shared = load_weights(tmp_path / "run" / "checkpoints" / "best.safetensors")
    for key, value in trainer.model.state_dict().items():
        assert torch.equal(value, shared[key])
    assert summary["param_groups"]["ssm"]["lr"] == pytest.approx(0.003)


def test_schedule_is_applied_per_step(tmp_path):
    trainer = _trainer(tmp_path, cfg={"epochs": 2, "warmup": 3, "min_lr_ratio": 0.2, "log_every": 1})
    trainer.fit()
    lrs = [r["lr"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["split"] == "train"]
    expected = [0.01 * trainer.schedule.multiplier(s) for s in range(12)]
    assert lrs == pytest.approx(expected)
    assert lrs[0] == pytest.approx(0.01 / 3) and lrs[-1] > 0.002


class NeverImproves(ToyObjective):
    def summarize(self, sums):
        return {**super().summarize(sums), "accuracy": 0.5}


def test_early_stopping(tmp_path):
    trainer = _trainer(tmp_path, cfg={"epochs": 50, "eval_every": 2, "patience": 3}, objective=NeverImproves())
    summary = trainer.fit()
    assert summary["stopped_early"] and summary["step"] == 8 and summary["best"]["step"] == 2
    vals = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["split"] == "val"]
    assert len(vals) == 4
    # Resuming a stopped run does not train further.
    model, tr, va, _ = toy_setup()
    again = Trainer(
        model,
        NeverImproves(),
        tr,
        va,
        collate,
        {**FAST, "epochs": 50, "eval_every": 2, "patience": 3},
        tmp_path / "run",
        resume=True,
        tensorboard=False,
    )
    assert again.fit()["step"] == 8


def test_grad_accumulation_equals_one_big_batch(tmp_path):
    runs = {}
    for accum in (1, 4):
        trainer = _trainer(
            tmp_path, f"accum{accum}", cfg={"grad_accum": accum, "grad_clip": 0.5}, dtype=torch.float64, test_set=None
        )
        trainer.fit()
        runs[accum] = load_checkpoint(tmp_path / f"accum{accum}" / "checkpoints" / "last.pt")["model"]
    for key, value in runs[1].items():
        torch.testing.assert_close(runs[4][key], value, rtol=1e-12, atol=1e-14, msg=key)
    assert not torch.equal(runs[1]["embed.weight"], toy_setup(dtype=torch.float64)[0].embed.weight)


def test_evaluation_sums_equal_a_full_batch(tmp_path):
    trainer = _trainer(tmp_path, cfg={"eval_batch_size": 3}, dtype=torch.float64)
    trainer.model.train()
    got = trainer.evaluate(trainer.val_set)
    assert trainer.model.training  # restored
    model = trainer.model.eval()
    with torch.no_grad():
        full = ToyObjective()(model, collate([trainer.val_set[i] for i in range(len(trainer.val_set))]))
    expected = ToyObjective().summarize(full.sums)
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-12)
    assert got["accuracy"] == expected["accuracy"]


class DtypeProbe(ToyObjective):
    def __call__(self, model, batch):
        out = super().__call__(model, batch)
        self.seen = model.embed(batch["inputs"]).dtype
        return out


def test_bf16_autocast_runs_on_cpu(tmp_path):
    probe = DtypeProbe()
    summary = _trainer(tmp_path, cfg={"precision": "bf16", "epochs": 1}, objective=probe).fit()
    assert probe.seen == torch.bfloat16
    assert all(torch.isfinite(torch.tensor(v)) for v in summary["final"].values())


def test_fp16_on_cpu_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="fp16.*CUDA.*bf16"):
        _trainer(tmp_path, cfg={"precision": "fp16"})


def test_set_epoch_is_called_each_epoch_and_max_steps(tmp_path):
    trainer = _trainer(tmp_path, cfg={"max_steps": 15, "epochs": 1})
    summary = trainer.fit()
    assert trainer.train_set.epochs_seen == [0, 1, 2]
    assert summary["step"] == 15 and summary["epochs"] == pytest.approx(2.5)
    vals = [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["split"] == "val"]
    assert vals == [6, 12, 15]  # each epoch, and at the end


def test_run_directory_guards(tmp_path):
    _trainer(tmp_path, cfg={"epochs": 1}).fit()
    with pytest.raises(ConfigError, match=r"already holds an unfinished run \(last.pt\); pass --resume"):
        _trainer(tmp_path, cfg={"epochs": 1})
    _trainer(tmp_path, cfg={"epochs": 1}, overwrite=True).fit()
    assert len(read_metrics(tmp_path / "run" / "metrics.jsonl")) == 5  # 3 train, 1 val, 1 test


def test_bad_inputs_are_clear_errors(tmp_path):
    with pytest.raises(
        ConfigError,
        match="batch_size 64 is larger than the training set \\(48 items\\): no complete batch; lower train.batch_size",
    ):
        _trainer(tmp_path, cfg={"batch_size": 64})
    from torch.utils.data import Subset

    from longrange.data.batch import collate
    from longrange.train.sampler import BatchPlan

    with pytest.raises(
        ConfigError, match=r"\(2 items\): task.train_subset kept 2 of its 20 items; raise task.train_subset"
    ):
        BatchPlan(Subset(list(range(20)), [3, 7]), collate, batch_size=32)
    with pytest.raises(ConfigError, match="unknown field.*train.bach_size.*did you mean batch_size"):
        _trainer(tmp_path, cfg={"bach_size": 4})

    class WrongMetric(ToyObjective):
        metric = "f1"

    with pytest.raises(ConfigError, match="selection metric 'f1'.*\\['accuracy', 'loss'\\]"):
        _trainer(tmp_path, "wrong", objective=WrongMetric()).fit()
    with pytest.raises(ConfigError, match="'summarize'"):
        _trainer(tmp_path, "nosum", objective=SimpleNamespace(metric="a", higher_is_better=True))


def test_train_entry_point_accepts_task_data_and_dicts(tmp_path):
    model, tr, va, te = toy_setup()
    data = SimpleNamespace(train=tr, val=va, test=te, collate=collate)
    summary = train(model, ToyObjective(), data, {**FAST, "epochs": 1}, tmp_path / "a", tensorboard=False)
    assert summary["test"] is not None and summary["step"] == 6
    model, tr, va, te = toy_setup()
    summary = train(model, ToyObjective(), {"train": tr}, {**FAST, "epochs": 1}, tmp_path / "b", tensorboard=False)
    assert summary["best"]["step"] == 6 and summary["test"] is None
    assert (tmp_path / "b" / "checkpoints" / "best.safetensors").exists()
    with pytest.raises(ConfigError, match="'valid'"):
        train(model, ToyObjective(), {"train": tr, "valid": va}, FAST, tmp_path / "c")


def test_tensorboard_events_when_available(tmp_path):
    pytest.importorskip("tensorboard")
    model, tr, va, _ = toy_setup()
    Trainer(model, ToyObjective(), tr, va, collate, {**FAST, "epochs": 1}, tmp_path / "tb").fit()
    assert list((tmp_path / "tb" / "tensorboard").glob("events.out.tfevents.*"))


def test_sampler_shards_and_skips_exactly():
    n, batch, world, accum = 50, 12, 2, 3
    order = epoch_permutation(n, seed=4, epoch=1)
    assert sorted(order.tolist()) == list(range(n))
    assert not (order == epoch_permutation(n, seed=4, epoch=2)).all()
    per_rank = [
        list(ShardedBatchSampler(n, batch, 4, 1, rank=r, world_size=world, grad_accum=accum)) for r in range(world)
    ]
    assert all(len(p) == 4 * accum and all(len(m) == 2 for m in p) for p in per_rank)
    for b in range(4):  # rank slices of every global batch tile it in order
        pieces = [i for r in range(world) for m in per_rank[r][b * accum : (b + 1) * accum] for i in m]
        assert pieces == order[b * batch : (b + 1) * batch].tolist()
    tail = list(ShardedBatchSampler(n, batch, 4, 1, rank=1, world_size=world, grad_accum=accum, start_batch=3))
    assert tail == per_rank[1][3 * accum :]
    with pytest.raises(ValueError, match="not divisible"):
        ShardedBatchSampler(n, 10, 0, 0, world_size=4)
    shards = [eval_shards(7, 2, r, 3) for r in range(3)]
    assert sorted(i for s in shards for b in s for i in b) == list(range(7))


def test_loader_workers_do_not_change_the_run(tmp_path):
    weights = {}
    for workers in (0, 2):
        trainer = _trainer(
            tmp_path,
            f"w{workers}",
            cfg={"epochs": 1, "num_workers": workers},
            dropout=0.3,
            objective=ToyObjective(noise=0.1),
            test_set=None,
        )
        trainer.fit()
        weights[workers] = load_checkpoint(tmp_path / f"w{workers}" / "checkpoints" / "last.pt")["model"]
    for key, value in weights[0].items():
        assert torch.equal(weights[2][key], value), key


def test_plateau_schedule_reduces_lr_in_training(tmp_path):
    trainer = _trainer(
        tmp_path,
        cfg={
            "schedule": "plateau",
            "warmup": 0,
            "eval_every": 1,
            "plateau_patience": 2,
            "plateau_factor": 0.5,
            "log_every": 1,
            "epochs": 1,
        },
        objective=NeverImproves(),
    )
    trainer.fit()
    lrs = [r["lr"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["split"] == "train"]
    # Evaluations after steps 1..6: best at 1, bad at 2, 3 (halve), 4, 5 (halve).
    assert lrs == pytest.approx([0.01, 0.01, 0.01, 0.005, 0.005, 0.0025])


def test_iterable_dataset_is_refused(tmp_path):
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter([])

    model, _, va, _ = toy_setup()
    with pytest.raises(ConfigError, match="train set \\(Stream\\) has no length"):
        Trainer(model, ToyObjective(), Stream(), va, collate, FAST, tmp_path / "s")


def test_resume_keeps_the_saved_extra_config_and_refuses_other_settings(tmp_path):
    _trainer(tmp_path, cfg={"epochs": 1}, extra_config={"model": {"d": 16}}).fit()
    saved = (tmp_path / "run" / "config.yaml").read_text()
    for changed, field in (
        ({"epochs": 2}, "train.epochs: 1 -> 2"),
        ({"epochs": 1, "lr": 0.5}, "train.lr"),
        ({"epochs": 1, "seed": 4}, "train.seed: 0 -> 4"),
    ):
        with pytest.raises(RunMismatchError, match=f"cannot resume .*{field}.*--overwrite"):
            _trainer(tmp_path, cfg=changed, resume=True)
    with pytest.raises(RunMismatchError, match="model.d: 16 -> 17"):
        _trainer(tmp_path, cfg={"epochs": 1}, extra_config={"model": {"d": 17}}, resume=True)
    assert (tmp_path / "run" / "config.yaml").read_text() == saved  # nothing written by a refused resume
    # Presentation settings may differ; the saved extra config is kept when none is given.
    _trainer(tmp_path, cfg={"epochs": 1, "log_every": 3, "progress": False}, resume=True).fit()
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["model"] == {"d": 16} and config["train"]["epochs"] == 1
    steps = [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["split"] == "val"]
    assert steps == [6]


def test_resume_and_overwrite_together_are_an_error(tmp_path):
    with pytest.raises(ConfigError, match="--resume and --overwrite contradict"):
        _trainer(tmp_path, resume=True, overwrite=True)


def test_more_bad_inputs(tmp_path):
    _trainer(tmp_path, cfg={"epochs": 1}).fit()
    with pytest.raises(ConfigError, match="train.batch_size: 8 -> 4"):
        _trainer(tmp_path, cfg={"epochs": 1, "batch_size": 4}, resume=True)
    with pytest.raises(ConfigError, match="extra_config.model.act of type function"):
        _trainer(tmp_path, "x", extra_config={"model": {"act": lambda x: x}})
    model, tr, va, _ = toy_setup()
    with pytest.raises(ConfigError, match="\\(train\\[, val\\[, test\\]\\]\\), got 4"):
        train(model, ToyObjective(), (tr, va, va, va), FAST, tmp_path / "y")
    with pytest.raises(ConfigError, match="cannot find train/val/test datasets in a int"):
        train(model, ToyObjective(), 3, FAST, tmp_path / "z")

    class NoSums(ToyObjective):
        def __call__(self, model, batch):
            out = super().__call__(model, batch)
            out.sums = {}
            return out

    trainer = _trainer(tmp_path, "nosums", objective=NoSums())
    with pytest.raises(ValueError, match="no sums on the val set \\(20 items\\)"):
        trainer.evaluate(trainer.val_set)


def test_progress_bar_only_on_a_terminal_and_when_asked(tmp_path, monkeypatch):
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for name, progress, stream in (
        ("tty", True, Terminal()),
        ("off", False, Terminal()),
        ("pipe", True, io.StringIO()),
    ):
        monkeypatch.setattr(sys, "stderr", stream)
        _trainer(tmp_path, name, cfg={"epochs": 1, "progress": progress}).fit()
        shown = stream.getvalue()
        if name == "tty":
            assert "6/6" in shown and "loss=" in shown and "lr=" in shown
        elif name == "pipe":  # no bar; the validation metrics as a plain line
            assert shown == "step 6/6: val loss 0.66, accuracy 0.6\n" or shown.startswith("step 6/6: val ")
            assert "\r" not in shown and "loss=" not in shown
        else:
            assert shown == ""
