"""What a run records of where and how it ran (device, precision, the kernels that ran, merged over
resumed segments), and ``train.deterministic``."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn
from toy import ToyModel, ToyObjective, toy_setup

from longrange.data.batch import collate, padding_mask
from longrange.ops import used
from longrange.ops.scan import DETERMINISTIC_BACKWARD, auto_impl, default_impl, selective_scan
from longrange.train import Trainer, load_checkpoint
from longrange.train.environment import CUBLAS_WORKSPACE, cpu_name, describe_precision, merge_kernels, set_deterministic
from longrange.train.logging import read_metrics

FAST = {"batch_size": 8, "epochs": 2, "lr": 0.01, "progress": False, "log_every": 2}


class ScanToy(ToyModel):
    """The toy model with a selective scan over its embedding: an op whose implementation the
    dispatch chooses (and, in deterministic mode, chooses among the deterministic ones)."""

    def __init__(self, n: int = 4):
        super().__init__()
        d = self.embed.out_features
        self.A_log = nn.Parameter(torch.log(torch.arange(1.0, n + 1)).repeat(d, 1))
        self.bc = nn.Linear(d, 2 * n)
        self.dt = nn.Linear(d, d)

    def forward(self, inputs: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.embed(inputs.to(self.embed.weight.dtype)))  # (batch, length, d)
        B, C = self.bc(x).transpose(1, 2).chunk(2, dim=1)
        y = selective_scan(
            x.transpose(1, 2), self.dt(x).transpose(1, 2), -torch.exp(self.A_log), B, C, delta_softplus=True
        ).transpose(1, 2)
        h = y * self.gain + self.norm_bias
        mask = padding_mask(lengths, x.shape[1]).unsqueeze(-1).to(h.dtype)
        return self.head((h * mask).sum(1) / lengths.unsqueeze(-1).to(h.dtype))


class Probe(ToyObjective):
    """Notes whether PyTorch's deterministic algorithms were on in each training step."""

    def __init__(self):
        super().__init__()
        self.deterministic: set[bool] = set()

    def __call__(self, model, batch):
        if model.training:
            self.deterministic.add(torch.are_deterministic_algorithms_enabled())
        return super().__call__(model, batch)


def _trainer(run_dir, objective=None, **cfg):
    _, tr, va, te = toy_setup()
    torch.manual_seed(0)
    return Trainer(
        ScanToy(),
        objective or ToyObjective(),
        tr,
        va,
        collate,
        {**FAST, **cfg},
        run_dir,
        test_set=te,
        tensorboard=False,
    )


def test_fit_returns_the_device_precision_and_the_kernels_that_ran(tmp_path):
    used.note("selective_scan", "ran-before-training")  # forgotten when training starts
    result = _trainer(tmp_path / "run", precision="bf16", epochs=1).fit()
    from longrange.train.denormals import mode

    threads = torch.get_num_threads()
    assert result["device"] == {
        "type": "cpu",
        "name": cpu_name(),
        "count": 1,
        "threads": threads,
        "denormals": mode("cpu"),
    }
    assert result["precision"] == {"autocast": "bfloat16", "params": "float32"}
    assert result["kernels"] == {"selective_scan": auto_impl("cpu")}
    assert result["deterministic"] is False
    assert describe_precision(None, nn.Linear(2, 2).double()) == {"autocast": None, "params": "float64"}


class Stop(Exception):
    pass


def test_a_resumed_run_merges_the_kernels_of_its_segments(tmp_path):
    first = _trainer(tmp_path / "run", checkpoint_every=2)

    def stop(step, path):
        if step == 4:
            raise Stop

    first.on_checkpoint = stop
    with default_impl("chunked"), pytest.raises(Stop):
        first.fit()
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["kernels"] == {"selective_scan": "chunked"}
    _, tr, va, te = toy_setup()
    again = Trainer(
        ScanToy(),
        ToyObjective(),
        tr,
        va,
        collate,
        {**FAST, "checkpoint_every": 2},
        tmp_path / "run",
        test_set=te,
        tensorboard=False,
        resume=True,
    )
    result = again.fit()
    assert result["kernels"] == {
        "selective_scan": merge_kernels({"selective_scan": "chunked"}, {"selective_scan": auto_impl("cpu")})[
            "selective_scan"
        ]
    }
    assert merge_kernels({"a": "x+y", "b": "z"}, {"a": "w"}, None) == {"a": "w+x+y", "b": "z"}


def test_deterministic_runs_are_bitwise_equal_and_pytorchs_settings_are_restored(tmp_path, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    assert not torch.are_deterministic_algorithms_enabled()
    benchmark = torch.backends.cudnn.benchmark
    probes, results = [], []
    for name in ("a", "b"):
        probes.append(Probe())
        results.append(_trainer(tmp_path / name, probes[-1], deterministic=True).fit())
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE  # set before any CUDA work
    # on during training, as they were afterwards
    assert probes[0].deterministic == probes[1].deterministic == {True}
    assert not torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cudnn.deterministic and torch.backends.cudnn.benchmark == benchmark
    assert results[0]["deterministic"] is True
    assert all(DETERMINISTIC_BACKWARD[impl] for impl in results[0]["kernels"]["selective_scan"].split("+"))
    # the same bits: weights, and every logged number
    a, b = (load_checkpoint(tmp_path / name / "checkpoints" / "last.pt")["model"] for name in ("a", "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    lines = [
        [(r["step"], r["split"], r["metrics"]) for r in read_metrics(tmp_path / name / "metrics.jsonl")]
        for name in ("a", "b")
    ]
    assert lines[0] == lines[1] and len(lines[0]) > 4
    assert results[0]["best"] == results[1]["best"] and results[0]["test"] == results[1]["test"]


def test_set_deterministic_keeps_a_users_cublas_setting_and_restores_warn_only(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        restore = set_deterministic(True)
        assert (
            torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
        )
        restore()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    finally:
        torch.use_deterministic_algorithms(False)
    set_deterministic(False)()  # off: nothing changes
    assert not torch.are_deterministic_algorithms_enabled()
