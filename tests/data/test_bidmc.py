"""BIDMC regression tasks from small .npy fixtures in the S4 layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import longrange.data  # noqa: F401  (registers the tasks)
from longrange.data import get_spec, load_task, task_status
from longrange.errors import ConfigError, DataFormatError, DataMissingError

SIZES = {"train": 5, "valid": 3, "test": 2}


def make_bidmc(tmp_path, target="RR", split_dir="reshuffle", seed=0):
    d = tmp_path / "bidmc" / target / split_dir if split_dir else tmp_path / "bidmc" / target
    d.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, n in SIZES.items():
        arrays[f"{name}x"] = rng.standard_normal((n, 4000, 2))
        arrays[f"{name}y"] = rng.uniform(10, 30, size=n)
        for k in ("x", "y"):
            np.save(d / f"{name}{k}.npy", arrays[f"{name}{k}"])
    return d, arrays


def test_end_to_end(tmp_path):
    _, arrays = make_bidmc(tmp_path, "HR")
    for name, opts in (("bidmc", {"target": "HR"}), ("bidmc-hr", {})):
        data = load_task(name, tmp_path, **opts)
        spec = data.spec
        assert (spec.seq_len, spec.d_input, spec.n_classes, spec.metric, spec.mask_ratio) == (4000, 2, 0, "r2", 0.25)
        assert (len(data.train), len(data.val), len(data.test)) == (5, 3, 2)
        item = data.val[1]
        assert item["inputs"].shape == (4000, 2) and item["inputs"].dtype == torch.float32
        assert item["target"].shape == (1,)
        assert torch.allclose(item["inputs"], torch.from_numpy(arrays["validx"][1]).float())
        assert torch.allclose(item["target"], torch.tensor([arrays["validy"][1]], dtype=torch.float32))
        batch = data.collate([data.train[0], data.train[1]])
        assert batch["targets"].shape == (2, 1)
    assert task_status("bidmc-hr", tmp_path)[0]


def test_flat_layout_and_options(tmp_path):
    make_bidmc(tmp_path, "SpO2", split_dir=None)
    assert len(load_task("bidmc-spo2", tmp_path).train) == 5
    with pytest.raises(ConfigError, match="target"):
        get_spec("bidmc", target="BP")
    with pytest.raises(ConfigError, match="split"):
        get_spec("bidmc", split="random")


def test_missing(tmp_path):
    with pytest.raises(DataMissingError, match=r"bidmc/RR/reshuffle/trainx\.npy.*process_data\.py"):
        load_task("bidmc", tmp_path)
    d, _ = make_bidmc(tmp_path)
    (d / "testy.npy").unlink()
    with pytest.raises(DataMissingError, match=r"testy\.npy"):
        load_task("bidmc", tmp_path)


def test_wrong_shapes_name_file_and_shape(tmp_path):
    d, _ = make_bidmc(tmp_path)
    np.save(d / "validx.npy", np.zeros((3, 3999, 2)))
    with pytest.raises(DataFormatError, match=r"validx\.npy: inputs have shape \(3, 3999, 2\)"):
        load_task("bidmc", tmp_path)
    np.save(d / "validx.npy", np.zeros((3, 4000, 2)))
    np.save(d / "validy.npy", np.zeros(4))
    with pytest.raises(DataFormatError, match=r"validy\.npy: 4 targets for 3 inputs"):
        load_task("bidmc", tmp_path)
    np.save(d / "validy.npy", np.zeros((3, 2)))
    with pytest.raises(DataFormatError, match=r"validy\.npy: targets have shape \(3, 2\)"):
        load_task("bidmc", tmp_path)
    (d / "validy.npy").write_bytes(b"not numpy")
    with pytest.raises(DataFormatError, match=r"validy\.npy: not a readable"):
        load_task("bidmc", tmp_path)


def test_non_finite_sample_raises_or_is_skipped(tmp_path):
    d, arrays = make_bidmc(tmp_path)
    x = arrays["trainx"].copy()
    x[2, 100, 1] = np.nan
    np.save(d / "trainx.npy", x)
    with pytest.raises(DataFormatError, match=r"trainx\.npy: sample 2 has a non-finite value"):
        load_task("bidmc", tmp_path)
    data = load_task("bidmc", tmp_path, skip_bad=True)
    assert data.skipped == {str(d / "trainx.npy"): 1} and len(data.train) == 4
