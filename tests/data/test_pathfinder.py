"""The pathfinder loader on hand-written fixtures in the LRA layout (PNGs + text metadata)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import longrange.data  # noqa: F401  (registers the tasks)
from longrange.data import get_spec, load_task, task_status
from longrange.data.pathfinder import difficulty_dirname, read_metadata, split_indices
from longrange.errors import ConfigError, DataFormatError, DataMissingError


def make_pathfinder(root, resolution=32, n=20, difficulty="curv_contour_length_14", per_dir=10, seed=0):
    """Write ``n`` random grayscale images; returns (difficulty dir, pixels (n, R*R), labels)."""
    d = root / f"pathfinder{resolution}" / difficulty
    (d / "metadata").mkdir(parents=True)
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(n, resolution, resolution), dtype=np.uint8)
    labels = np.arange(n) % 2
    rows = {}
    for i in range(n):
        k, j = divmod(i, per_dir)
        (d / "imgs" / str(k)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels[i]).save(d / "imgs" / str(k) / f"sample_{j}.png")
        rows.setdefault(k, []).append(f"imgs/{k} sample_{j}.png {j} {labels[i]} 1.8 14 5 2 1 1 1")
    for k, lines in rows.items():
        (d / "metadata" / f"{k}.npy").write_text("\n".join(lines) + "\n")
    return d, pixels.reshape(n, -1), labels


def _collect(ds):
    return [(tuple(ds[i]["inputs"].flatten().tolist()), int(ds[i]["target"])) for i in range(len(ds))]


def test_numeric_end_to_end_and_split(tmp_path):
    _, pixels, labels = make_pathfinder(tmp_path / "pathfinder")
    data = load_task("pathfinder", tmp_path, seed=42)
    assert data.spec.seq_len == 1024 and data.spec.input_kind == "numeric" and data.spec.n_classes == 2
    assert data.spec.mask_ratio == 0.5
    assert (len(data.train), len(data.val), len(data.test)) == (16, 2, 2)
    item = data.train[0]
    assert item["inputs"].shape == (1024, 1) and item["inputs"].dtype == torch.float32
    assert item["inputs"].min() >= -1.0 and item["inputs"].max() <= 1.0
    # every split item is one of the fixture images with its label, each image exactly once
    ref = {(tuple(((pixels[i].astype(np.float32) / 255 - 0.5) / 0.5).tolist()), int(labels[i])) for i in range(20)}
    got = _collect(data.train) + _collect(data.val) + _collect(data.test)
    assert len(got) == 20
    for x, y in got:
        match = [r for r in ref if r[1] == y and np.allclose(r[0], x, atol=1e-6)]
        assert len(match) == 1
    # the split follows a seeded permutation (S4's random_split order: train, val, test)
    tr, va, te = split_indices(20, 42)
    perm = torch.randperm(20, generator=torch.Generator().manual_seed(42))
    assert torch.equal(torch.cat([tr, va, te]), perm)


def test_tokens_variant_and_aliases(tmp_path):
    make_pathfinder(tmp_path / "pathfinder", resolution=32)
    data = load_task("pathfinder", tmp_path, input_kind="tokens", seed=1)
    x = data.train[0]["inputs"]
    assert x.dtype == torch.long and x.shape == (1024,) and int(x.min()) >= 5 and int(x.max()) <= 260
    assert data.vocab_size == 261
    assert get_spec("path-x").seq_len == 128 * 128
    assert get_spec("path-x-256").seq_len == 256 * 256
    for bad in (4, "big", True):
        with pytest.raises(ConfigError, match="resolution: must be a side of at least 8 pixels"):
            get_spec("pathfinder", resolution=bad)
    assert get_spec("pathfinder", resolution=16).seq_len == 256  # generated data comes in any size


def test_reads_a_generated_resolution_that_lra_does_not_publish(tmp_path):
    make_pathfinder(tmp_path / "pathfinder", resolution=16)
    data = load_task("pathfinder", tmp_path, resolution=16, difficulty="curv_contour_length_14")
    assert data.train[0]["inputs"].shape == (256, 1)
    with pytest.raises(DataMissingError, match="pathfinder24"):
        load_task("pathfinder", tmp_path, resolution=24)
    with pytest.raises(ConfigError, match="input_kind"):
        get_spec("pathfinder", input_kind="pixels")


def test_difficulty_names():
    assert difficulty_dirname(6) == "curv_baseline" == difficulty_dirname("easy")
    assert difficulty_dirname("intermediate") == "curv_contour_length_9"
    assert difficulty_dirname("hard") == difficulty_dirname(14) == "curv_contour_length_14"
    with pytest.raises(ConfigError, match="difficulty"):
        difficulty_dirname("medium-rare")


def test_lra_release_root_and_difficulty(tmp_path):
    make_pathfinder(tmp_path / "lra_release" / "lra_release", difficulty="curv_baseline", n=10)
    data = load_task("pathfinder", tmp_path, difficulty="easy")
    assert len(data.train) + len(data.val) + len(data.test) == 10
    present, lines = task_status("pathfinder", tmp_path, difficulty="easy")
    assert present and all("found" in line for line in lines)


def test_missing_data_names_path_and_how_to_obtain(tmp_path):
    with pytest.raises(DataMissingError, match=r"pathfinder32.*longrange data generate pathfinder"):
        load_task("pathfinder", tmp_path)
    make_pathfinder(tmp_path / "pathfinder", n=4)
    with pytest.raises(DataMissingError, match="curv_contour_length_9"):
        load_task("pathfinder", tmp_path, difficulty=9)


def test_metadata_errors_name_file_and_line(tmp_path):
    path = tmp_path / "0.npy"
    path.write_text("imgs/0 sample_0.png 0 1\nimgs/0 sample_1.png 1\n")
    with pytest.raises(DataFormatError, match=r"0\.npy, line 2: expected at least 4 columns"):
        read_metadata(path)
    path.write_text("imgs/0 sample_0.png 0 1\n\nimgs/0 sample_1.png 1 2 x\n")
    with pytest.raises(DataFormatError, match=r"0\.npy, line 3: label '2' is not 0 or 1"):
        read_metadata(path)
    rows, skipped = read_metadata(path, skip_bad=True)
    assert rows == [("imgs/0/sample_0.png", 1, 1)] and skipped == 1
    path.write_bytes(b"\x93NUMPY\x01\x00\xff\xfe binary")
    with pytest.raises(DataFormatError, match="text rows"):
        read_metadata(path)


def test_unreadable_and_missing_images(tmp_path):
    d, _, _ = make_pathfinder(tmp_path / "pathfinder", n=20)
    (d / "imgs" / "1" / "sample_3.png").write_bytes(b"")  # empty file, as in the LRA release
    with pytest.raises(DataFormatError, match=r"sample_3\.png: unreadable image.*listed in .*1\.npy, line 4"):
        load_task("pathfinder", tmp_path)
    data = load_task("pathfinder", tmp_path, skip_bad=True)
    assert data.skipped == {str(d / "metadata" / "1.npy"): 1}
    assert len(data.train) + len(data.val) + len(data.test) == 19
    (d / "imgs" / "0" / "sample_2.png").unlink()
    with pytest.raises(DataFormatError, match=r"sample_2\.png: image file is missing.*0\.npy, line 3"):
        load_task("pathfinder", tmp_path)


def test_wrong_image_size(tmp_path):
    d, _, _ = make_pathfinder(tmp_path / "pathfinder", n=4)
    Image.fromarray(np.zeros((16, 16), dtype=np.uint8)).save(d / "imgs" / "0" / "sample_1.png")
    with pytest.raises(DataFormatError, match=r"sample_1\.png: image is 16x16, expected 32x32"):
        load_task("pathfinder", tmp_path)


def test_bad_metadata_row_through_loader(tmp_path):
    d, _, _ = make_pathfinder(tmp_path / "pathfinder", n=4)
    with open(d / "metadata" / "0.npy", "a") as f:
        f.write("imgs/0 sample_9.png 9 7 1 1 1 1 1 1 1\n")
    with pytest.raises(DataFormatError, match=r"0\.npy, line 5: label '7'"):
        load_task("pathfinder", tmp_path)
    data = load_task("pathfinder", tmp_path, skip_bad=True)
    assert data.skipped == {str(d / "metadata" / "0.npy"): 1}


def test_decoded_once_then_cached(tmp_path, monkeypatch):
    make_pathfinder(tmp_path / "pathfinder", n=10)
    first = load_task("pathfinder", tmp_path, seed=3)
    calls = []
    import longrange.data.pathfinder as pf

    monkeypatch.setattr(pf, "decode_png", lambda *a, **k: calls.append(a) or (_ for _ in ()).throw(AssertionError))
    again = load_task("pathfinder", tmp_path, seed=3)
    assert calls == []
    assert _collect(first.train) == _collect(again.train)
    assert any(p.name.startswith("pathfinder32-") for p in (tmp_path / ".cache").iterdir())
