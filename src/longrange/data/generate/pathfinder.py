"""A Pathfinder generator writing the LRA layout, so the ``pathfinder`` task reads its output.

The task (Linsley et al., 2018; LRA's Pathfinder): an image holds dashed curved contours and two
small round markers; the label is 1 when the markers sit on the two ends of one contour, 0 when
they sit on ends of two different contours.

Scene construction (a simplified version of the original "snakes" generator):
  * Two *target* contours of ``contour_length`` dashes each, plus ``n_distractors`` shorter
    distractor contours of ``distractor_length`` dashes. Every image has the same two long contours
    whatever its label, so the label is not revealed by the amount of ink.
  * A contour is a random walk of dashes: each dash has length ``dash_length`` and is separated from
    the next by a gap of ``gap``; its direction turns from the previous dash's by an angle drawn
    uniformly in ``[-max_turn, max_turn]`` degrees (bounded curvature).
  * Contours keep ``clearance`` pixels away from each other and from markers, and from their own
    non-adjacent dashes, so two contours never touch and the label stays well defined; a dash that
    cannot be placed is redrawn (a bounded number of times), then the contour, then the scene.
  * Every dash endpoint stays at least ``margin`` pixels inside the image, markers included.
  * Label 1: markers at both ends of target contour A. Label 0: a marker at one (random) end of A
    and one at one (random) end of B.
  * Rendering with Pillow: dashes as lines of ``thickness`` pixels, markers as discs of radius
    ``marker_radius``, intensity 255 on black.
Lengths scale with the resolution (defaults are given for 32 and multiplied by ``R / 32``).

Output (``R`` = resolution, ``C`` = contour length, difficulty directory as in the loader:
``curv_baseline`` for C = 6, else ``curv_contour_length_C``)::

    <out_dir>/pathfinder{R}/<difficulty>/imgs/<k>/sample_<j>.png      (grayscale PNG, R x R)
    <out_dir>/pathfinder{R}/<difficulty>/metadata/<k>.npy             (text rows, LRA columns)

Metadata rows have the LRA columns ``imgs/<k> sample_<j>.png <index> <label> <continuity>
<contour_length> <distractor_length> <dash_length> <thickness> <margin> <n_contrasts>``.

Determinism: sample ``i`` is drawn from ``numpy.random.default_rng([seed, R, C, i])`` and the
balanced labels from ``default_rng([seed, n_samples])``; PNGs are written without timestamps, so a
seed gives byte-identical files.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from longrange.data.generate.base import Generator, check_int, check_positive
from longrange.errors import ConfigError

#: Maximum attempts before giving up (per dash, per contour, per scene).
_DASH_TRIES, _CONTOUR_TRIES, _SCENE_TRIES = 24, 60, 50


@dataclass(frozen=True)
class SceneParams(Generator):
    """Geometry of a scene, in pixels of an R x R image (see the module docstring); as a generator
    (``generate/base.py``), ``draw(rng, label)`` is :func:`sample_scene`."""

    name: ClassVar[str] = "pathfinder generator"

    resolution: int = 32
    contour_length: int = 14
    distractor_length: int = 5
    n_distractors: int = 2
    dash_length: float = 1.2
    gap: float = 0.8
    max_turn: float = 40.0
    thickness: int = 1
    marker_radius: float = 1.2
    clearance: float = 1.5
    margin: float = 2.0

    def check(self) -> None:
        from longrange.data.pathfinder import MIN_RESOLUTION

        check_int(self.name, "resolution", self.resolution, MIN_RESOLUTION, why="pixels per side")
        check_int(self.name, "contour_length", self.contour_length, 2, why="dashes per target contour")
        check_int(self.name, "distractor_length", self.distractor_length, 1)
        check_int(self.name, "n_distractors", self.n_distractors, 0)
        check_int(self.name, "thickness", self.thickness, 1)
        for name in ("dash_length", "marker_radius"):
            check_positive(self.name, name, getattr(self, name))
        for name in ("gap", "max_turn", "clearance", "margin"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{self.name} option {name} must be a number >= 0, got {getattr(self, name)!r}")

    def draw(self, rng: np.random.Generator, label: int) -> Scene:
        return sample_scene(rng, label, self)

    @classmethod
    def for_resolution(
        cls,
        resolution: int,
        contour_length: int = 14,
        n_distractors: int | None = None,
        distractor_length: int | None = None,
        **overrides,
    ) -> SceneParams:
        """Defaults scaled by ``resolution / 32``."""
        s = resolution / 32.0
        base = dict(
            resolution=resolution,
            contour_length=contour_length,
            distractor_length=distractor_length if distractor_length is not None else max(2, contour_length // 3),
            n_distractors=n_distractors if n_distractors is not None else 2,
            dash_length=1.2 * s,
            gap=0.8 * s,
            thickness=max(1, round(s)),
            marker_radius=1.2 * s,
            clearance=1.5 * s,
            margin=2.0 * s,
        )
        base.update(overrides)
        return cls(**base)


@dataclass
class Scene:
    """A drawn scene. ``contours[c]`` is float (n_dashes, 2, 2): per dash its start and end (x, y);
    contours 0 and 1 are the targets. ``markers`` are the two (x, y) marker centres and
    ``marker_contours`` the index of the contour whose end each marker sits on."""

    contours: list[np.ndarray]
    markers: list[tuple[float, float]]
    marker_contours: list[int]
    label: int
    params: SceneParams = field(default_factory=SceneParams)

    def endpoints(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """The two ends (first dash start, last dash end) of contour ``c``."""
        return self.contours[c][0, 0], self.contours[c][-1, 1]


@functools.lru_cache(maxsize=64)
def _disc_offsets(radius: float) -> np.ndarray:
    """Integer (dx, dy) offsets within ``radius`` of the origin."""
    rr = int(math.ceil(radius))
    return np.array(
        [
            (dx, dy)
            for dx in range(-rr, rr + 1)
            for dy in range(-rr, rr + 1)
            if dx * dx + dy * dy <= radius * radius + 1e-9
        ],
        dtype=np.int64,
    )


class _Occupancy:
    """Pixels already claimed by contours or markers, with a clearance disc around each."""

    def __init__(self, resolution: int):
        self.grid = np.zeros((resolution, resolution), dtype=np.int32)  # owner id + 1, 0 = free
        self.r = resolution

    def _points(self, p: np.ndarray, q: np.ndarray) -> np.ndarray:
        n = max(2, int(math.ceil(np.linalg.norm(q - p) * 4)) + 1)
        t = np.linspace(0.0, 1.0, n)[:, None]
        return p[None, :] * (1 - t) + q[None, :] * t

    def _cells(self, pts: np.ndarray, radius: float) -> tuple[np.ndarray, np.ndarray]:
        offs = _disc_offsets(radius)
        base = np.rint(pts).astype(np.int64)
        cells = (base[:, None, :] + offs[None, :, :]).reshape(-1, 2)
        keep = (cells[:, 0] >= 0) & (cells[:, 0] < self.r) & (cells[:, 1] >= 0) & (cells[:, 1] < self.r)
        cells = cells[keep]
        return cells[:, 1], cells[:, 0]  # rows (y), cols (x)

    def segment_free(self, p, q, radius: float, ignore: set[int]) -> bool:
        ys, xs = self._cells(self._points(p, q), radius)
        owners = self.grid[ys, xs]
        return all(int(o) - 1 in ignore for o in np.unique(owners[owners > 0]))

    def claim_segment(self, p, q, radius: float, owner: int) -> None:
        ys, xs = self._cells(self._points(p, q), radius)
        free = self.grid[ys, xs] == 0
        self.grid[ys[free], xs[free]] = owner + 1


def _inside(p: np.ndarray, params: SceneParams) -> bool:
    lo, hi = params.margin, params.resolution - 1 - params.margin
    return bool(lo <= p[0] <= hi and lo <= p[1] <= hi)


def _walk(
    rng: np.random.Generator, n_dashes: int, occ: _Occupancy, owner: int, params: SceneParams, reserve_ends: bool
) -> np.ndarray | None:
    """Try to place one contour; returns (n_dashes, 2, 2) or None. Claims its pixels on success."""
    lo, hi = params.margin, params.resolution - 1 - params.margin
    # Strokes must stay ``clearance`` plus half their own width away from other contours.
    radius = params.clearance + params.thickness / 2.0
    end_radius = params.clearance + params.marker_radius
    for _ in range(_CONTOUR_TRIES):
        start = rng.uniform(lo, hi, size=2)
        if reserve_ends and not occ.segment_free(start, start, end_radius, set()):
            continue
        theta = rng.uniform(0.0, 2.0 * math.pi)
        dashes: list[tuple[np.ndarray, np.ndarray]] = []
        local = _Occupancy(params.resolution)  # own earlier dashes, to avoid self-contact
        p = start
        ok = True
        for k in range(n_dashes):
            placed = False
            for _ in range(_DASH_TRIES):
                th = theta if k == 0 else theta + math.radians(rng.uniform(-params.max_turn, params.max_turn))
                d = np.array([math.cos(th), math.sin(th)])
                q = p + params.dash_length * d
                if not (_inside(p, params) and _inside(q, params)):
                    continue
                if not occ.segment_free(p, q, radius, set()):
                    continue
                # own dashes except the previous one (which this dash continues)
                if not local.segment_free(p, q, params.thickness / 2.0 + params.gap * 0.5, {k - 1}):
                    continue
                placed = True
                break
            if not placed:
                ok = False
                break
            dashes.append((p, q))
            local.claim_segment(p, q, params.thickness / 2.0, k)
            theta = th
            p = q + params.gap * d
        if not ok:
            continue
        arr = np.array([[a, b] for a, b in dashes], dtype=np.float64)
        if reserve_ends and not occ.segment_free(arr[-1, 1], arr[-1, 1], end_radius, set()):
            continue
        for a, b in dashes:
            occ.claim_segment(a, b, params.thickness / 2.0, owner)
        if reserve_ends:
            occ.claim_segment(arr[0, 0], arr[0, 0], params.marker_radius, owner)
            occ.claim_segment(arr[-1, 1], arr[-1, 1], params.marker_radius, owner)
        return arr
    return None


def sample_scene(rng: np.random.Generator, label: int, params: SceneParams) -> Scene:
    """Draw one scene with the given label (see the module docstring)."""
    if label not in (0, 1):
        raise ValueError(f"label must be 0 or 1, got {label}")
    for _ in range(_SCENE_TRIES):
        occ = _Occupancy(params.resolution)
        contours = []
        for c in range(2):
            arr = _walk(rng, params.contour_length, occ, c, params, reserve_ends=True)
            if arr is None:
                break
            contours.append(arr)
        if len(contours) < 2:
            continue
        for c in range(params.n_distractors):
            arr = _walk(rng, params.distractor_length, occ, 2 + c, params, reserve_ends=False)
            if arr is None:
                break
            contours.append(arr)
        if len(contours) < 2 + params.n_distractors:
            continue
        ends_a = (contours[0][0, 0], contours[0][-1, 1])
        ends_b = (contours[1][0, 0], contours[1][-1, 1])
        if label == 1:
            markers, owners = [ends_a[0], ends_a[1]], [0, 0]
        else:
            markers, owners = [ends_a[int(rng.integers(2))], ends_b[int(rng.integers(2))]], [0, 1]
        return Scene(contours, [tuple(map(float, m)) for m in markers], owners, label, params)
    raise RuntimeError(
        f"could not place {2 + params.n_distractors} contours in a {params.resolution}x{params.resolution} image "
        f"after {_SCENE_TRIES} attempts; use fewer distractors or a shorter contour"
    )


def render(scene: Scene) -> np.ndarray:
    """Draw a scene: uint8 (R, R), 255 on 0."""
    from PIL import Image, ImageDraw

    p = scene.params
    im = Image.new("L", (p.resolution, p.resolution), 0)
    draw = ImageDraw.Draw(im)
    # Pillow truncates float coordinates; shifting by half a pixel makes it round them, as the
    # occupancy grid does, so strokes and markers land on the pixels nearest their coordinates.
    for contour in scene.contours:
        for a, b in contour + 0.5:
            draw.line([tuple(a), tuple(b)], fill=255, width=p.thickness)
    r = p.marker_radius
    for x, y in scene.markers:
        draw.ellipse([x + 0.5 - r, y + 0.5 - r, x + 0.5 + r, y + 0.5 + r], fill=255)
    return np.asarray(im, dtype=np.uint8)


def balanced_labels(n_samples: int, seed: int) -> np.ndarray:
    """``n_samples`` labels, half 1 (the extra one of an odd count is 0), in seeded random order."""
    labels = np.zeros(n_samples, dtype=np.int64)
    labels[: n_samples // 2] = 1
    return np.random.default_rng([seed, n_samples]).permutation(labels)


def sample_rng(seed: int, resolution: int, contour_length: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, resolution, contour_length, index])


def _write_text_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def generate(
    out_dir: str | Path,
    resolution: int = 32,
    n_samples: int = 1000,
    contour_length: int = 14,
    n_distractors: int | None = None,
    seed: int = 0,
    samples_per_dir: int = 1000,
    distractor_length: int | None = None,
    quiet: bool = False,
    **geometry,
) -> Path:
    """Generate ``n_samples`` images in the LRA layout under ``out_dir``; returns the difficulty dir.

    Args:
        out_dir: root that receives ``pathfinder{R}/<difficulty>/...`` (use ``<data_dir>/pathfinder``
            for the ``pathfinder`` task to find it).
        resolution: image side R (any positive size; LRA uses 32, 64, 128, 256).
        n_samples: number of images (labels balanced).
        contour_length: dashes per target contour (the difficulty; LRA: 6, 9, 14).
        n_distractors: number of short distractor contours (default 2).
        seed: makes the output byte-identical across runs.
        samples_per_dir: images per ``imgs/<k>`` directory and metadata file (LRA: 1000).
        distractor_length: dashes per distractor (default ``max(2, contour_length // 3)``).
        quiet: no progress bar (it is also off when stderr is not a terminal).
        geometry: overrides of :class:`SceneParams` fields (``dash_length``, ``gap``, ``max_turn``...).
    """
    from PIL import Image
    from tqdm import tqdm

    from longrange.data.pathfinder import MIN_RESOLUTION, difficulty_dirname

    check_int(SceneParams.name, "resolution", resolution, MIN_RESOLUTION, why="pixels per side")
    check_int(SceneParams.name, "n_samples", n_samples, 1)
    check_int(SceneParams.name, "contour_length", contour_length, 2, why="dashes per target contour")
    check_int(SceneParams.name, "samples_per_dir", samples_per_dir, 1)
    unknown = sorted(set(geometry) - set(SceneParams.__dataclass_fields__))
    if unknown:
        raise ConfigError(
            f"unknown geometry option {unknown[0]!r}; valid: {', '.join(SceneParams.__dataclass_fields__)}"
        )
    params = SceneParams.for_resolution(resolution, contour_length, n_distractors, distractor_length, **geometry)
    root = Path(out_dir) / f"pathfinder{resolution}" / difficulty_dirname(contour_length)
    (root / "metadata").mkdir(parents=True, exist_ok=True)
    labels = balanced_labels(n_samples, seed)
    rows: dict[int, list[str]] = {}
    show = not quiet and sys.stderr.isatty()
    for i in tqdm(range(n_samples), desc=f"pathfinder{resolution} C={contour_length}", unit="img", disable=not show):
        k, j = divmod(i, samples_per_dir)
        img_dir = root / "imgs" / str(k)
        img_dir.mkdir(parents=True, exist_ok=True)
        scene = sample_scene(sample_rng(seed, resolution, contour_length, i), int(labels[i]), params)
        Image.fromarray(render(scene)).save(img_dir / f"sample_{j}.png", format="PNG")
        rows.setdefault(k, []).append(
            f"imgs/{k} sample_{j}.png {j} {int(labels[i])} {params.max_turn:g} {params.contour_length} "
            f"{params.distractor_length} {params.dash_length:g} {params.thickness} {params.margin:g} 1"
        )
    for k, lines in rows.items():
        _write_text_atomic(root / "metadata" / f"{k}.npy", "\n".join(lines) + "\n")
    return root


#: The generator's options (``task.generate``) with their defaults; resolution and contour length
#: come from the task's options ``resolution`` and ``difficulty``.
GENERATE_DEFAULTS = dict(
    resolution=32,
    n_samples=1000,
    contour_length=14,
    n_distractors=None,
    seed=0,
    samples_per_dir=1000,
    distractor_length=None,
)


def _from_task(options: dict) -> dict:
    from longrange.data.pathfinder import difficulty_dirname

    difficulty = options.get("difficulty", "curv_contour_length_14")
    name, prefix = difficulty_dirname(difficulty), "curv_contour_length_"
    if name == "curv_baseline":
        length = 6
    elif name.startswith(prefix) and name[len(prefix) :].isdigit():
        length = int(name[len(prefix) :])
    else:
        raise ConfigError(
            f"task.generate: the Pathfinder generator needs a contour length as the difficulty, got {difficulty!r}"
        )
    return {"resolution": int(options.get("resolution", 32)), "contour_length": length}


def _build(root: Path, quiet: bool = True, **options) -> None:
    generate(Path(root) / "pathfinder", quiet=quiet, **options)  # the layout the pathfinder task reads


def _register() -> None:
    from longrange.data.generated import register_generator

    register_generator("pathfinder", _build, GENERATE_DEFAULTS, from_task=_from_task)


_register()
