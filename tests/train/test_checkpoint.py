"""Checkpoints: atomic writes, refusal of code-carrying pickles, weights loading, RNG capture."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn

from longrange.errors import CheckpointError
from longrange.train import load_checkpoint, load_weights, save_checkpoint
from longrange.train.checkpoint import rng_state, save_safetensors, set_rng_state


class _Payload:
    """Unpickling this calls ``open(marker, "w")``: a stand-in for arbitrary code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_round_trip_plain_state(tmp_path):
    state = {
        "model": {"w": torch.arange(6.0).reshape(2, 3)},
        "step": 7,
        "best": {"value": None},
        "history": [{"step": 1, "metrics": {"accuracy": 0.5}}],
        "betas": (0.9, 0.99),
    }
    path = save_checkpoint(state, tmp_path / "c.pt")
    loaded = load_checkpoint(path)
    assert loaded["format"] == 1 and loaded["step"] == 7 and loaded["best"] == {"value": None}
    assert torch.equal(loaded["model"]["w"], state["model"]["w"])
    assert loaded["history"] == state["history"] and tuple(loaded["betas"]) == (0.9, 0.99)


def test_failed_write_leaves_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ckpt" / "last.pt"
    save_checkpoint({"step": 1, "w": torch.ones(3)}, path)
    real_save = torch.save

    def broken_save(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 partial bytes of a zip archive")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint({"step": 2, "w": torch.zeros(3)}, path)
    monkeypatch.setattr(torch, "save", real_save)
    loaded = load_checkpoint(path)
    assert loaded["step"] == 1 and torch.equal(loaded["w"], torch.ones(3))
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.pt"]  # no temporary left behind


def test_code_carrying_pickle_is_refused(tmp_path):
    marker = tmp_path / "executed"
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "payload": _Payload(marker)}, path)
    with pytest.raises(CheckpointError, match=r"refusing to load .*evil\.pt.*execute code"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="execute code"):
        load_weights(path)
    assert not marker.exists()
    # The payload is real: an unrestricted load runs it.
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        load_checkpoint(tmp_path / "none.pt")
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read checkpoint .*bad.pt"):
        load_checkpoint(bad)
    lst = tmp_path / "list.pt"
    torch.save([1, 2], lst)
    with pytest.raises(CheckpointError, match="holds a list"):
        load_checkpoint(lst)


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.out = nn.Linear(3, 5, bias=False)
        self.out.weight = self.emb.weight


def test_load_weights_from_pt_and_safetensors(tmp_path):
    torch.manual_seed(0)
    src = Tied()
    save_checkpoint({"model": src.state_dict()}, tmp_path / "best.pt")
    save_safetensors(src.state_dict(), tmp_path / "best.safetensors")
    for name in ("best.pt", "best.safetensors"):
        dst = Tied()
        weights = load_weights(tmp_path / name, model=dst)
        assert set(weights) == {"emb.weight", "out.weight"}
        assert torch.equal(dst.emb.weight, src.emb.weight) and dst.out.weight is dst.emb.weight


def test_load_weights_mismatch_names_keys(tmp_path):
    save_checkpoint({"model": nn.Linear(3, 4).state_dict()}, tmp_path / "a.pt")
    with pytest.raises(CheckpointError, match=r"shape mismatches \['weight: model \(2, 3\) vs file \(4, 3\)"):
        load_weights(tmp_path / "a.pt", model=nn.Linear(3, 2))
    with pytest.raises(CheckpointError, match=r"missing keys \['emb.weight'.*unexpected keys \['weight', 'bias'\]"):
        load_weights(tmp_path / "a.pt", model=Tied())
    save_checkpoint({"step": 1}, tmp_path / "b.pt")
    with pytest.raises(CheckpointError, match="no 'model' entry"):
        load_weights(tmp_path / "b.pt")
    (tmp_path / "c.safetensors").write_bytes(b"junk")
    with pytest.raises(CheckpointError, match="cannot read safetensors"):
        load_weights(tmp_path / "c.safetensors")


def test_rng_state_survives_a_weights_only_round_trip(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.randn()  # leave a cached gaussian in numpy's state
    save_checkpoint({"rng": rng_state()}, tmp_path / "r.pt")
    expected = (random.random(), np.random.randn(3).tolist(), torch.rand(3))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    set_rng_state(load_checkpoint(tmp_path / "r.pt")["rng"])
    got = (random.random(), np.random.randn(3).tolist(), torch.rand(3))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])


class _RunsCommand:
    """Unpickling this runs a shell command (torch 2.6+ words its refusal differently from open)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_command_payload_is_refused_in_our_words(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "last.pt"
    torch.save({"model": {}, "payload": _RunsCommand(marker)}, path)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    message = str(err.value)
    assert "refusing to load" in message and "system" in message and "execute code" in message
    # PyTorch's own advice to load without restrictions never reaches the user
    assert "weights_only" not in message and "Re-running" not in message and "will likely succeed" not in message
    assert not marker.exists()


def _finished_toy_run(run_dir):
    from toy import ToyObjective, toy_setup

    from longrange.data.batch import collate
    from longrange.train import Trainer

    model, tr, va, te = toy_setup()
    Trainer(
        model,
        ToyObjective(),
        tr,
        va,
        collate,
        {"batch_size": 8, "epochs": 1, "lr": 0.01, "progress": False},
        run_dir,
        test_set=te,
        tensorboard=False,
    ).fit()
    return model


@pytest.mark.parametrize("keep", ["empty", 40, "half", "zeros"])
def test_truncated_last_pt_names_best_weights_and_overwrite(tmp_path, keep):
    from toy import ToyObjective, toy_setup

    from longrange.data.batch import collate
    from longrange.train import Trainer

    run = tmp_path / "run"
    _finished_toy_run(run)
    last, best = run / "checkpoints" / "last.pt", run / "checkpoints" / "best.safetensors"
    data = last.read_bytes()
    if keep == "zeros":
        last.write_bytes(b"\0" * len(data))
    else:
        last.write_bytes(b"" if keep == "empty" else data[: len(data) // 2 if keep == "half" else keep])
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(last)
    message = str(err.value)
    assert "truncated or corrupt" in message and str(best) in message and "--overwrite" in message
    assert "Errno" not in message and "weights_only" not in message
    # the best weights it points to are usable
    assert load_weights(best)
    # resuming the run gives the same error
    model, tr, va, te = toy_setup()
    with pytest.raises(CheckpointError, match="best.safetensors.*--overwrite"):
        Trainer(
            model,
            ToyObjective(),
            tr,
            va,
            collate,
            {"batch_size": 8, "epochs": 1, "lr": 0.01, "progress": False},
            run,
            test_set=te,
            tensorboard=False,
            resume=True,
        ).fit()


def test_corrupt_checkpoint_elsewhere_has_no_run_advice(tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(CheckpointError, match=r"model\.pt: the file is truncated or corrupt$"):
        load_checkpoint(path)
