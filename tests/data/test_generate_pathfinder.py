"""The Pathfinder generator: determinism, balance, layout readable by the loader, label geometry."""

from __future__ import annotations

import numpy as np
import pytest

import longrange.data  # noqa: F401  (registers the tasks)
from longrange.data import load_task
from longrange.data.generate.pathfinder import (
    SceneParams,
    balanced_labels,
    generate,
    render,
    sample_rng,
    sample_scene,
)
from longrange.errors import ConfigError


def _files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_deterministic_byte_identical(tmp_path):
    a = generate(tmp_path / "a", resolution=32, n_samples=6, seed=5, samples_per_dir=4, quiet=True)
    b = generate(tmp_path / "b", resolution=32, n_samples=6, seed=5, samples_per_dir=4, quiet=True)
    c = generate(tmp_path / "c", resolution=32, n_samples=6, seed=6, samples_per_dir=4, quiet=True)
    fa, fb, fc = _files(a), _files(b), _files(c)
    assert fa == fb
    assert fa != fc
    assert set(fa) == {
        *(p for p in fa if str(p).startswith("imgs/")),
        *(p for p in fa if str(p).startswith("metadata/")),
    }
    assert {str(p) for p in fa if str(p).startswith("metadata/")} == {"metadata/0.npy", "metadata/1.npy"}
    assert a == tmp_path / "a" / "pathfinder32" / "curv_contour_length_14"


def test_balanced_labels():
    for n in (1, 2, 7, 10):
        labels = balanced_labels(n, seed=3)
        assert len(labels) == n and labels.sum() == n // 2
    assert not np.array_equal(balanced_labels(40, 0), balanced_labels(40, 1))


def test_generated_layout_loads_with_the_task(tmp_path):
    root = generate(
        tmp_path / "pathfinder", resolution=32, n_samples=10, contour_length=6, seed=0, samples_per_dir=5, quiet=True
    )
    assert root.name == "curv_baseline"
    rows = [line.split() for f in sorted((root / "metadata").iterdir()) for line in f.read_text().splitlines()]
    assert all(len(r) == 11 and r[0].startswith("imgs/") for r in rows)
    assert sum(int(r[3]) for r in rows) == 5
    data = load_task("pathfinder", tmp_path, difficulty=6, input_kind="tokens", seed=0)
    items = [data.train[i] for i in range(len(data.train))] + [data.val[0], data.test[0]]
    assert len(items) == 10
    assert sorted(int(it["target"]) for it in items) == [0] * 5 + [1] * 5
    # images have ink (255 -> id 260) and background (0 -> id 5)
    x = items[0]["inputs"]
    assert int(x.max()) == 260 and int(x.min()) == 5


@pytest.mark.parametrize("resolution", [32, 64])
def test_label_geometry_and_bounds(resolution):
    params = SceneParams.for_resolution(resolution, contour_length=9, n_distractors=2)
    for i in range(6):
        label = i % 2
        scene = sample_scene(sample_rng(1, resolution, 9, i), label, params)
        assert len(scene.contours) == 4
        assert [len(c) for c in scene.contours] == [9, 9, params.distractor_length, params.distractor_length]
        # each marker is an endpoint of the contour it names
        owners = []
        for marker in scene.markers:
            hits = [c for c in range(2) for end in scene.endpoints(c) if np.allclose(end, marker)]
            assert len(hits) == 1
            owners.append(hits[0])
        assert owners == scene.marker_contours
        same_contour = owners[0] == owners[1] and not np.allclose(scene.markers[0], scene.markers[1])
        assert same_contour == (label == 1)
        # everything stays inside the image, markers' discs included
        pts = np.concatenate([c.reshape(-1, 2) for c in scene.contours])
        lo, hi = params.margin, resolution - 1 - params.margin
        assert pts.min() >= lo and pts.max() <= hi
        assert params.margin >= params.marker_radius
        # contours keep apart: the clearance is enforced on the pixel grid, so allow one pixel of rounding
        t = np.linspace(0, 1, 5)[:, None]
        samples = [np.concatenate([a + (b - a) * t for a, b in c]) for c in scene.contours]
        for u in range(4):
            for v in range(u + 1, 4):
                d = np.linalg.norm(samples[u][:, None, :] - samples[v][None, :, :], axis=-1).min()
                assert d > params.clearance - 1.0, (u, v, d)
        img = render(scene)
        assert img.shape == (resolution, resolution) and img.dtype == np.uint8
        for x, y in scene.markers:
            assert img[int(round(y)), int(round(x))] == 255


def test_bad_arguments():
    with pytest.raises(ConfigError, match="n_samples"):
        generate("unused", n_samples=0)
    with pytest.raises(ConfigError, match="contour_length"):
        generate("unused", contour_length=1)
    with pytest.raises(ConfigError, match="unknown geometry option 'curvyness'"):
        generate("unused", curvyness=3)
    with pytest.raises(ValueError, match="label"):
        sample_scene(sample_rng(0, 32, 14, 0), 2, SceneParams())
