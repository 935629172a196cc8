"""train/denormals.py: subnormal floats flushed to zero on a CPU while a run trains, the mode found
restored after it, the setting that keeps them, and the results unchanged but below the subnormal
range."""

from __future__ import annotations

import threading

import pytest
import torch
from toy import ToyObjective, toy_setup

from longrange.data.batch import collate
from longrange.errors import ConfigError
from longrange.train import Trainer
from longrange.train import denormals as D

pytestmark = pytest.mark.skipif(not torch.set_flush_denormal(False), reason="this CPU has no flush-to-zero mode")


@pytest.fixture(autouse=True)
def ieee(monkeypatch):
    """Each test starts with IEEE subnormals on this thread and the default setting; the mode found is
    put back after it."""
    monkeypatch.delenv(D.ENV, raising=False)
    before = D.flushing()
    torch.set_flush_denormal(False)
    yield
    torch.set_flush_denormal(before)


def test_flushing_is_set_on_the_calling_thread_and_restored():
    tiny = torch.tensor([1e-39])
    assert not D.flushing() and (tiny * 1.0).item() != 0.0
    restore = D.flush_denormals("cpu")
    assert D.flushing() and (tiny * 1.0).item() == 0.0
    seen = []
    thread = threading.Thread(target=lambda: seen.append(D.flushing()))  # started after: inherits it
    thread.start()
    thread.join()
    assert seen == [True]
    restore()
    assert not D.flushing()
    torch.set_flush_denormal(True)  # a mode already set stays set
    D.flush_denormals("cpu")()
    assert D.flushing()


def test_keep_other_devices_and_a_bad_setting(monkeypatch):
    assert D.flush_denormals("meta")() is None and not D.flushing()
    monkeypatch.setenv(D.ENV, "Keep")
    assert D.setting() == "keep" and D.mode("cpu") == "kept"
    D.flush_denormals("cpu")
    assert not D.flushing()
    monkeypatch.setenv(D.ENV, "ftz")
    with pytest.raises(ConfigError, match="LONGRANGE_DENORMALS='ftz': expected 'flush' .* or 'keep'"):
        D.flush_denormals("cpu")
    monkeypatch.delenv(D.ENV)
    assert D.mode("cpu") == "flushed" and not D.flushing()  # asking does not change the mode


class Probe(ToyObjective):
    """Notes whether the training thread flushed subnormals in each training step."""

    def __init__(self):
        super().__init__()
        self.flushing: set[bool] = set()

    def __call__(self, model, batch):
        if model.training:
            self.flushing.add(D.flushing())
        return super().__call__(model, batch)


@pytest.mark.parametrize("setting", ["flush", "keep"])
def test_a_run_trains_in_the_mode_it_records(tmp_path, monkeypatch, setting):
    monkeypatch.setenv(D.ENV, setting)
    model, tr, va, te = toy_setup()
    probe = Probe()
    cfg = {"batch_size": 8, "epochs": 1, "lr": 0.01, "progress": False}
    result = Trainer(model, probe, tr, va, collate, cfg, tmp_path / "run", test_set=te, tensorboard=False).fit()
    assert probe.flushing == {setting == "flush"}
    assert result["device"]["denormals"] == ("flushed" if setting == "flush" else "kept")
    assert not D.flushing()  # the mode found is back after the run


def test_flushed_holds_the_mode_for_a_block_and_restores_it(monkeypatch):
    with D.flushed("cpu"):
        assert D.flushing()
    assert not D.flushing()
    monkeypatch.setenv(D.ENV, "keep")
    with D.flushed("cpu"):
        assert not D.flushing()


class Stop(Exception):
    pass


def _trainer(run, **kw) -> Trainer:
    cfg = {"batch_size": 8, "epochs": 2, "lr": 0.01, "progress": False, "checkpoint_every": 2}
    model, tr, va, te = toy_setup()
    return Trainer(model, ToyObjective(), tr, va, collate, cfg, run, test_set=te, tensorboard=False, **kw)


def _stopped_with_subnormals_kept(run, monkeypatch) -> None:
    """A run stopped after its first checkpoint, trained with subnormals kept."""

    def stop(step, path):
        raise Stop

    monkeypatch.setenv(D.ENV, "keep")
    first = _trainer(run)
    first.on_checkpoint = stop
    with pytest.raises(Stop):
        first.fit()


@pytest.mark.parametrize("second", ["keep", "flush"])
def test_a_run_resumed_in_the_other_mode_records_both(tmp_path, monkeypatch, second):
    """Stopped after its first checkpoint with subnormals kept, resumed with the setting ``second``:
    the record says ``mixed`` where the segments differ, the one mode where they agree."""
    _stopped_with_subnormals_kept(tmp_path / "run", monkeypatch)
    monkeypatch.setenv(D.ENV, second)
    result = _trainer(tmp_path / "run", resume=True).fit()
    assert result["device"]["denormals"] == ("kept" if second == "keep" else "mixed")


@pytest.mark.parametrize("saved", ["no device record", "no mode in it"])
def test_a_run_resumed_from_a_checkpoint_without_a_mode_records_both(tmp_path, monkeypatch, saved):
    """A checkpoint written before the mode was recorded trained with subnormals kept: resumed with
    them flushed, the record says ``mixed``, never ``flushed`` alone."""
    from longrange.train import load_checkpoint, save_checkpoint

    _stopped_with_subnormals_kept(tmp_path / "run", monkeypatch)
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    ckpt = load_checkpoint(last)
    if saved == "no device record":
        del ckpt["device"]
    else:
        del ckpt["device"]["denormals"]
    save_checkpoint(ckpt, last)
    monkeypatch.setenv(D.ENV, "flush")
    assert _trainer(tmp_path / "run", resume=True).fit()["device"]["denormals"] == "mixed"


def test_a_scan_whose_gradients_underflow_gives_the_same_gradients_flushed():
    """A selective scan over 512 positions with fast decays: its backward carries gradients through
    the subnormal range (the case that ran 5x slower with IEEE subnormals on an Intel Xeon). Flushed,
    values and gradients equal IEEE arithmetic's up to float32 rounding."""
    from longrange.ops.scan import selective_scan

    g = torch.Generator().manual_seed(0)
    b, d, n, l = 2, 16, 8, 512
    inputs = [
        torch.randn(b, d, l, generator=g),
        torch.rand(b, d, l, generator=g) + 0.5,
        -torch.linspace(1.0, 40.0, n).repeat(d, 1),
        torch.randn(b, 1, n, l, generator=g),
        torch.randn(b, 1, n, l, generator=g),
    ]
    out = {}
    for flush in (False, True):
        torch.set_flush_denormal(flush)
        leaves = [t.clone().requires_grad_() for t in inputs]
        y = selective_scan(*leaves, delta_softplus=True)
        y.backward(torch.ones_like(y))
        out[flush] = [y.detach()] + [t.grad for t in leaves]
    torch.set_flush_denormal(False)
    for a, f in zip(out[False], out[True]):
        torch.testing.assert_close(f, a, rtol=1e-5, atol=1e-30)
