"""CIFAR-10 tasks (image, image-numeric, scifar) from tiny pickle fixtures in the published layout."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

import longrange.data  # noqa: F401  (registers the tasks)
from longrange.data import load_task
from longrange.data.image import (
    GRAY_MEAN,
    GRAY_STD,
    RGB_MEAN,
    RGB_STD,
    planes_to_pixels,
    read_cifar_batch,
    rgb_to_gray_lra,
    split_train_val,
)
from longrange.errors import DataFormatError, DataMissingError

N_PER_BATCH = 4  # 5 train batches -> 20 train images; N_VAL is patched to 5


def _write_batch(path, data, labels):
    with open(path, "wb") as f:
        pickle.dump({b"data": data, b"labels": list(labels), b"batch_label": b"x"}, f)


def make_cifar(tmp_path, seed=0):
    root = tmp_path / "cifar10" / "cifar-10-batches-py"
    root.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(N_PER_BATCH, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=N_PER_BATCH)
        _write_batch(root / name, data, labels)
        batches[name] = (data, labels)
    with open(root / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [b"c%d" % i for i in range(10)]}, f)
    return root, batches


@pytest.fixture
def small_val(monkeypatch):
    monkeypatch.setattr("longrange.data.image.N_VAL", 5)


def test_grayscale_matches_lra_formula_on_known_pixels():
    rgb = np.array([[[255, 255, 255], [0, 0, 0], [255, 0, 0], [10, 200, 30], [0, 255, 0]]], dtype=np.uint8)
    gray = rgb_to_gray_lra(rgb)
    # trunc((0.2989 R + 0.5870 G + 0.1140 B) / 255 * 255.5)
    expected = [
        int((0.2989 + 0.5870 + 0.1140) * 255.5),  # 255 (0.9999 * 255.5 = 255.47)
        0,
        int(0.2989 * 255.5),  # 76
        int((0.2989 * 10 + 0.5870 * 200 + 0.1140 * 30) / 255 * 255.5),
        int(0.5870 * 255.5),  # 149
    ]
    assert gray.tolist() == [expected]
    assert expected[0] == 255 and expected[2] == 76 and expected[4] == 149


def test_planes_to_pixels_raster_order():
    data = np.zeros((1, 3072), dtype=np.uint8)
    data[0, 0] = 1  # R of pixel (0, 0)
    data[0, 1024 + 33] = 2  # G of pixel (1, 1) -> raster index 33
    data[0, 2048 + 1023] = 3  # B of the last pixel
    pix = planes_to_pixels(data)
    assert pix.shape == (1, 1024, 3)
    assert pix[0, 0, 0] == 1 and pix[0, 33, 1] == 2 and pix[0, 1023, 2] == 3
    assert pix.sum() == 6


def test_split_is_seeded_and_disjoint():
    a_train, a_val = split_train_val(50, 5, seed=3)
    b_train, b_val = split_train_val(50, 5, seed=3)
    c_train, c_val = split_train_val(50, 5, seed=4)
    assert torch.equal(a_val, b_val) and not torch.equal(a_val, c_val)
    assert sorted(torch.cat([a_train, a_val]).tolist()) == list(range(50))


def test_image_tokens_end_to_end(tmp_path, small_val):
    root, batches = make_cifar(tmp_path)
    data = load_task("image", tmp_path, seed=1)
    assert data.spec.input_kind == "tokens" and data.spec.seq_len == 1024 and data.spec.mask_ratio == 0.5
    assert len(data.train) == 15 and len(data.val) == 5 and len(data.test) == N_PER_BATCH
    assert data.vocab_size == 5 + 256
    item = data.test[2]
    raw, labels = batches["test_batch"]
    expected = rgb_to_gray_lra(planes_to_pixels(raw[2:3]))[0].astype(np.int64) + 5
    assert item["inputs"].dtype == torch.long and item["inputs"].shape == (1024,)
    assert item["inputs"].tolist() == expected.tolist()
    assert int(item["target"]) == labels[2]
    batch = data.collate([data.train[0], data.train[1]])
    assert batch["inputs"].shape == (2, 1024)
    # train and val together are exactly the 20 training images
    all_train = np.concatenate([batches[f"data_batch_{i}"][0] for i in range(1, 6)])
    seen = {tuple(data.train[i]["inputs"].tolist()) for i in range(len(data.train))}
    seen |= {tuple(data.val[i]["inputs"].tolist()) for i in range(len(data.val))}
    ref = {
        tuple((rgb_to_gray_lra(planes_to_pixels(all_train[i : i + 1]))[0].astype(np.int64) + 5).tolist())
        for i in range(20)
    }
    assert seen == ref


def test_image_numeric_and_scifar_normalisation(tmp_path, small_val):
    _, batches = make_cifar(tmp_path)
    raw, _ = batches["test_batch"]
    num = load_task("image-numeric", tmp_path).test[0]["inputs"]
    gray = rgb_to_gray_lra(planes_to_pixels(raw[:1]))[0].astype(np.float32)
    assert num.shape == (1024, 1) and num.dtype == torch.float32
    assert torch.allclose(num[:, 0], torch.from_numpy((gray - GRAY_MEAN) / GRAY_STD), atol=1e-5)
    sc = load_task("scifar", tmp_path).test[0]["inputs"]
    rgb = planes_to_pixels(raw[:1])[0].astype(np.float32) / 255.0
    ref = (rgb - np.array(RGB_MEAN, dtype=np.float32)) / np.array(RGB_STD, dtype=np.float32)
    assert sc.shape == (1024, 3)
    assert torch.allclose(sc, torch.from_numpy(ref), atol=1e-5)


def test_missing_directory_names_path_and_source(tmp_path):
    with pytest.raises(DataMissingError, match="cifar-10-batches-py.*cs.toronto.edu"):
        load_task("image", tmp_path)


def test_missing_batch_file(tmp_path, small_val):
    root, _ = make_cifar(tmp_path)
    (root / "data_batch_3").unlink()
    with pytest.raises(DataMissingError, match="data_batch_3"):
        load_task("scifar", tmp_path)


def test_corrupt_pickle_names_file(tmp_path):
    path = tmp_path / "data_batch_1"
    path.write_bytes(b"not a pickle at all")
    with pytest.raises(DataFormatError, match="data_batch_1.*not a readable"):
        read_cifar_batch(path)


def test_wrong_shape_names_file_and_shape(tmp_path):
    path = tmp_path / "test_batch"
    _write_batch(path, np.zeros((2, 100), dtype=np.uint8), [0, 1])
    with pytest.raises(DataFormatError, match=r"test_batch.*\(2, 100\)"):
        read_cifar_batch(path)
    _write_batch(path, np.zeros((2, 3072), dtype=np.uint8), [0])
    with pytest.raises(DataFormatError, match="labels"):
        read_cifar_batch(path)


def test_bad_label_raises_or_is_skipped(tmp_path, small_val):
    root, batches = make_cifar(tmp_path)
    data, labels = batches["data_batch_2"]
    labels = labels.copy()
    labels[1] = 12
    _write_batch(root / "data_batch_2", data, labels)
    with pytest.raises(DataFormatError, match=r"data_batch_2.*sample 1: label 12"):
        load_task("image", tmp_path)
    loaded = load_task("image", tmp_path, skip_bad=True)
    assert loaded.skipped == {str(root / "data_batch_2"): 1}
    assert len(loaded.train) + len(loaded.val) == 19
