"""Pathfinder, Path-X and Path-X-256 (LRA): are the two markers joined by one dashed contour?

Layout (the LRA release; ``longrange.data.generate.pathfinder`` writes the same)::

    <root>/pathfinder{R}/<difficulty>/imgs/<k>/sample_<i>.png
    <root>/pathfinder{R}/<difficulty>/metadata/<k>.npy

``<root>`` is ``<data_dir>/pathfinder``, ``<data_dir>/lra_release/lra_release``,
``<data_dir>/lra_release`` or ``<data_dir>`` itself (the first that holds ``pathfinder{R}``).
Despite the ``.npy`` extension, metadata files are whitespace-separated text, one row per image:
``<subpath> <file> <index> <label> ...`` where the image is ``<difficulty>/<subpath>/<file>``
(``<subpath>`` is ``imgs/<k>``) and ``<label>`` is 0 or 1. Metadata files are read in the numeric
order of their stems, rows in file order. Images are grayscale PNGs of R x R pixels.

Difficulties: ``curv_baseline`` (contour length 6, "easy"), ``curv_contour_length_9``
("intermediate"), ``curv_contour_length_14`` ("hard", the LRA default); the ``difficulty`` option
takes the directory name, the word, or the contour length.

Split: 80/10/10 by a random permutation seeded with the loader's ``seed`` (``torch.randperm``,
lengths ``val = int(0.1 N)``, ``test = int(0.1 N)``, train the rest, in that order of the
permutation: train, val, test). With ``seed=42`` this matches the S4 code's ``random_split``.

Inputs (option ``input_kind``):
  ``numeric`` (default, as the S4 LRA configs): float (R*R, 1), ``x / 255`` normalised with
              mean 0.5, std 0.5, i.e. values in [-1, 1];
  ``tokens``: LongTensor (R*R,), ``id = level + 5`` (256 levels after the five specials), the raw
              intensities the SPT paper's 256-way masked prediction uses.

Decoding 200k PNGs is slow, so they are decoded once into the data cache (uint8, with a progress
bar). The cache is keyed on the metadata files (path, size, mtime): replacing images without
touching the metadata is not detected; delete ``<data_dir>/.cache`` in that case.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from longrange.data.image import PixelDataset, level_vocabulary
from longrange.errors import ConfigError, DataFormatError, DataMissingError

#: The resolutions LRA publishes; ``longrange data generate pathfinder`` writes any side of at least
#: MIN_RESOLUTION pixels, and the task reads those too.
RESOLUTIONS = (32, 64, 128, 256)
MIN_RESOLUTION = 8
#: Normalisation of numeric inputs, in 0..255 units ((x/255 - 0.5) / 0.5).
NUMERIC_MEAN, NUMERIC_STD = 127.5, 127.5
VAL_FRACTION = TEST_FRACTION = 0.1
OBTAIN = (
    "download lra_release.gz from https://github.com/google-research/long-range-arena and extract it "
    "into <data_dir> (or point <data_dir> at the extracted lra_release), or generate a substitute with "
    "`longrange data generate pathfinder --out <data_dir>/pathfinder --resolution R`"
)
_DIFFICULTY_WORDS = {"easy": 6, "baseline": 6, "intermediate": 9, "hard": 14}


def difficulty_dirname(difficulty: str | int) -> str:
    """Directory name of a difficulty: a contour length (6 -> ``curv_baseline``, else
    ``curv_contour_length_{n}``), a word (easy | intermediate | hard) or the directory name itself."""
    if isinstance(difficulty, str):
        d = difficulty.strip()
        if d.startswith("curv_"):
            return d
        if d.lower() in _DIFFICULTY_WORDS:
            difficulty = _DIFFICULTY_WORDS[d.lower()]
        elif d.isdigit():
            difficulty = int(d)
        else:
            raise ConfigError(
                f"difficulty: unknown value {difficulty!r}; use easy | intermediate | hard, a contour "
                "length (6, 9, 14, ...) or a directory name such as curv_contour_length_14"
            )
    n = int(difficulty)
    if n < 1:
        raise ConfigError(f"difficulty: contour length must be positive, got {n}")
    return "curv_baseline" if n == 6 else f"curv_contour_length_{n}"


def find_resolution_dir(data_dir: str | Path, resolution: int) -> Path:
    """The ``pathfinder{R}`` directory under any of the accepted roots, or DataMissingError."""
    data_dir = Path(data_dir)
    name = f"pathfinder{resolution}"
    candidates = [
        data_dir / "pathfinder" / name,
        data_dir / "lra_release" / "lra_release" / name,
        data_dir / "lra_release" / name,
        data_dir / name,
    ]
    for c in candidates:
        if c.is_dir():
            return c
    raise DataMissingError(
        f"missing Pathfinder data: expected {candidates[0]} (or {', '.join(map(str, candidates[1:]))}); {OBTAIN}"
    )


def metadata_files(difficulty_dir: Path) -> list[Path]:
    """Metadata files of a difficulty directory in numeric order of their stems."""
    meta_dir = difficulty_dir / "metadata"
    if not meta_dir.is_dir():
        raise DataMissingError(f"missing Pathfinder metadata directory {meta_dir}; {OBTAIN}")
    files = [p for p in meta_dir.iterdir() if p.suffix == ".npy" and p.is_file()]
    bad = [p for p in files if not p.stem.isdigit()]
    if bad:
        raise DataFormatError("metadata file names must be <integer>.npy", bad[0])
    if not files:
        raise DataMissingError(f"no metadata files (<k>.npy) in {meta_dir}; {OBTAIN}")
    return sorted(files, key=lambda p: int(p.stem))


def read_metadata(path: Path, skip_bad: bool = False) -> tuple[list[tuple[str, int, int]], int]:
    """Rows of one metadata text file: ``[(relative image path, label, line number)]``, skipped count.

    A row with fewer than 4 columns or a label outside {0, 1} raises DataFormatError naming the
    file and line (or is skipped and counted with ``skip_bad``). Blank lines are ignored.
    """
    rows: list[tuple[str, int, int]] = []
    skipped = 0
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataFormatError(f"metadata must be text rows (found binary data: {exc.reason})", path) from exc
    for line_no, line in enumerate(text.splitlines(), start=1):
        cols = line.split()
        if not cols:
            continue
        err = None
        if len(cols) < 4:
            err = f"expected at least 4 columns (subpath, file, index, label), found {len(cols)}"
        elif cols[3] not in ("0", "1"):
            err = f"label {cols[3]!r} is not 0 or 1"
        if err is not None:
            if skip_bad:
                skipped += 1
                continue
            raise DataFormatError(err, path, line_no)
        rows.append((f"{cols[0]}/{cols[1]}", int(cols[3]), line_no))
    return rows, skipped


def decode_png(path: Path, resolution: int) -> np.ndarray:
    """Grayscale uint8 (R, R) pixels of one image; raises DataFormatError if missing or unreadable."""
    from PIL import Image, UnidentifiedImageError

    if not path.is_file():
        raise DataFormatError("image file is missing", path)
    try:
        with Image.open(path) as im:
            arr = np.asarray(im.convert("L"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise DataFormatError(f"unreadable image ({type(exc).__name__}: {exc})", path) from exc
    if arr.shape != (resolution, resolution):
        raise DataFormatError(f"image is {arr.shape[1]}x{arr.shape[0]}, expected {resolution}x{resolution}", path)
    return arr


def read_pathfinder(
    difficulty_dir: str | Path, resolution: int, skip_bad: bool = False, progress: bool | None = None
) -> dict:
    """Decode every image listed by the metadata of one difficulty directory.

    Returns ``{"pixels": uint8 tensor (N, R*R), "labels": int64 tensor (N,), "skipped": {file: count}}``.
    Errors name the image and the metadata file and line that referenced it; with ``skip_bad``
    the bad rows are skipped and counted per metadata file.
    """
    from tqdm import tqdm

    difficulty_dir = Path(difficulty_dir)
    rows: list[tuple[Path, int, Path, int]] = []
    skipped: dict[str, int] = {}
    for meta in metadata_files(difficulty_dir):
        meta_rows, n_bad = read_metadata(meta, skip_bad=skip_bad)
        if n_bad:
            skipped[str(meta)] = n_bad
        rows.extend((difficulty_dir / rel, label, meta, line) for rel, label, line in meta_rows)
    if not rows:
        raise DataFormatError("metadata lists no images", difficulty_dir / "metadata")
    pixels = np.empty((len(rows), resolution * resolution), dtype=np.uint8)
    labels = np.empty(len(rows), dtype=np.int64)
    n = 0
    show = sys.stderr.isatty() if progress is None else progress
    for image_path, label, meta, line in tqdm(
        rows, desc=f"decoding {difficulty_dir.parent.name}/{difficulty_dir.name}", unit="img", disable=not show
    ):
        try:
            arr = decode_png(image_path, resolution)
        except DataFormatError as exc:
            if skip_bad:
                skipped[str(meta)] = skipped.get(str(meta), 0) + 1
                continue
            raise DataFormatError(f"{exc} (listed in {meta}, line {line})") from exc
        pixels[n] = arr.reshape(-1)
        labels[n] = label
        n += 1
    return {"pixels": torch.from_numpy(pixels[:n]), "labels": torch.from_numpy(labels[:n]), "skipped": skipped}


def split_indices(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded 80/10/10 split of ``range(n)`` (train, val, test) as described in the module docstring."""
    n_val, n_test = int(VAL_FRACTION * n), int(TEST_FRACTION * n)
    n_train = n - n_val - n_test
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))
    return perm[:n_train], perm[n_train : n_train + n_val], perm[n_train + n_val :]


# ------------------------------------------------------------------------------------------------
# tasks
# ------------------------------------------------------------------------------------------------
_DEFAULTS = {"resolution": 32, "difficulty": "curv_contour_length_14", "input_kind": "numeric"}


def _check_options(resolution, input_kind) -> int:
    try:
        r = int(resolution)
    except (TypeError, ValueError):
        r = -1
    if isinstance(resolution, bool) or r < MIN_RESOLUTION:
        raise ConfigError(
            f"resolution: must be a side of at least {MIN_RESOLUTION} pixels (LRA publishes "
            f"{', '.join(map(str, RESOLUTIONS))}), got {resolution!r}"
        )
    if input_kind not in ("numeric", "tokens"):
        raise ConfigError(f"input_kind: must be 'numeric' or 'tokens', got {input_kind!r}")
    return r


def pathfinder_spec(name: str = "pathfinder", resolution=32, difficulty="curv_contour_length_14", input_kind="numeric"):
    from longrange.data.spec import TaskSpec

    r = _check_options(resolution, input_kind)
    dirname = difficulty_dirname(difficulty)
    return TaskSpec(
        name=name,
        input_kind=input_kind,
        seq_len=r * r,
        n_classes=2,
        metric="accuracy",
        mask_ratio=0.5,
        d_input=1,
        description=f"Pathfinder {r}x{r} ({dirname}): are the two markers on one contour? {input_kind} inputs of length {r * r}",
        layout=f"pathfinder/pathfinder{r}/{dirname}/{{imgs/<k>/sample_<i>.png,metadata/<k>.npy}}",
        obtain=OBTAIN,
    )


def load_pathfinder(
    data_dir: Path,
    spec,
    seed: int = 0,
    skip_bad: bool = False,
    resolution=32,
    difficulty="curv_contour_length_14",
    input_kind="numeric",
):
    """Load Pathfinder at one resolution and difficulty as TaskData (decoded once into the cache)."""
    from longrange.data.cache import cached
    from longrange.data.dataset import TaskData

    r = _check_options(resolution, input_kind)
    dirname = difficulty_dirname(difficulty)
    difficulty_dir = find_resolution_dir(data_dir, r) / dirname
    if not difficulty_dir.is_dir():
        raise DataMissingError(f"missing Pathfinder directory {difficulty_dir}; {OBTAIN}")
    sources = metadata_files(difficulty_dir)

    def build() -> dict:
        return read_pathfinder(difficulty_dir, r, skip_bad=skip_bad)

    store = cached(
        data_dir,
        f"pathfinder{r}-{dirname}",
        sources,
        {"resolution": r, "difficulty": dirname, "skip_bad": bool(skip_bad), "root": str(difficulty_dir.resolve())},
        build,
    )
    pixels = store["pixels"].unsqueeze(-1)
    labels = store["labels"]
    if input_kind == "numeric":
        mean, std = [NUMERIC_MEAN], [NUMERIC_STD]
    else:
        mean = std = None
    parts = [
        PixelDataset(pixels, labels, input_kind, mean, std, index=idx) for idx in split_indices(pixels.shape[0], seed)
    ]
    return TaskData(
        spec=spec,
        train=parts[0],
        val=parts[1],
        test=parts[2],
        vocab=level_vocabulary() if input_kind == "tokens" else None,
        skipped=dict(store["skipped"]),
        info={"source": str(difficulty_dir), "sizes": [len(p) for p in parts]},
    )


def expected_paths(data_dir: Path, resolution=32, difficulty="curv_contour_length_14", **_) -> list[Path]:
    """The difficulty directory's image and metadata folders (under the first root that exists)."""
    try:
        base = find_resolution_dir(data_dir, int(resolution))
    except DataMissingError:
        base = Path(data_dir) / "pathfinder" / f"pathfinder{int(resolution)}"
    d = base / difficulty_dirname(difficulty)
    return [d / "imgs", d / "metadata"]


def _register() -> None:
    from longrange.data.registry import register_task

    def make(name: str, fixed_resolution: int | None):
        def spec(**opts):
            o = {**_DEFAULTS, **opts}
            if fixed_resolution is not None:
                o["resolution"] = fixed_resolution
            return pathfinder_spec(name, **o)

        def loader(data_dir, spec, seed=0, skip_bad=False, **opts):
            o = {**_DEFAULTS, **opts}
            if fixed_resolution is not None:
                o["resolution"] = fixed_resolution
            return load_pathfinder(data_dir, spec, seed, skip_bad, **o)

        def expected(data_dir, **opts):
            o = {**_DEFAULTS, **opts}
            if fixed_resolution is not None:
                o["resolution"] = fixed_resolution
            return expected_paths(data_dir, **o)

        options = dict(_DEFAULTS)
        if fixed_resolution is not None:
            del options["resolution"]
        return spec, loader, options, expected

    for name, res in (("pathfinder", None), ("path-x", 128), ("path-x-256", 256)):
        spec, loader, options, expected = make(name, res)
        register_task(name, spec, loader, options, expected=expected)


_register()
