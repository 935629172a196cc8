"""CIFAR-10 as sequences: LRA Image (grayscale tokens), its numeric variant, and sequential CIFAR.

Source files (the CIFAR-10 "python version")::

    <data_dir>/cifar10/cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}

Each batch is a pickle dict with ``b"data"``: uint8 (N, 3072), the R plane, then G, then B, each
32x32 row-major, and ``b"labels"``: N ints in 0..9. Pixels are read in raster order (row by row), so
every task has length 1024.

Tasks
  ``image``          LRA Image. Grayscale as LRA computes it (``tf.image.rgb_to_grayscale`` on
                     uint8): ``gray = trunc((0.2989 R + 0.5870 G + 0.1140 B) / 255 * 255.5)``, i.e.
                     float conversion by /255, weighted sum, and TensorFlow's float->uint8 cast
                     (scale by 255.5, truncate). Tokens: 256 levels, ``id = level + 5`` (the five
                     specials come first). Inputs LongTensor (1024,).
  ``image-numeric``  Same grayscale, numeric (1024, 1), normalised as the S4 code normalises its
                     grayscale CIFAR: ``(gray - 122.6) / 61.0`` (mean 122.6/255, std 61.0/255 on
                     the [0, 1] scale).
  ``scifar``         Sequential CIFAR, RGB numeric (1024, 3), per-channel ``(x/255 - mean) / std``
                     with the CIFAR-10 statistics used by S4: mean (0.4914, 0.4822, 0.4465),
                     std (0.247, 0.243, 0.261).

Splits: test = ``test_batch`` (10k). Validation = 5k images drawn from the 50k training images by a
random permutation seeded with the loader's ``seed`` (``torch.randperm`` with a seeded generator;
the first 45k of the permutation train, the last 5k validate). With ``seed=42`` this is exactly
the S4 code's ``random_split`` of the training set.

The pickles load in about a second, so they are not cached. They are read by a restricted unpickler
(``longrange.data.safe_pickle``) that builds dicts, lists, strings, numbers and numpy arrays only:
a file that asks for anything else is refused, naming the global it asks for, and nothing from it runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from longrange.data.safe_pickle import load_data_pickle
from longrange.data.tokenize import FIRST_TOKEN_ID, Vocabulary
from longrange.errors import DataFormatError, DataMissingError

#: LRA (TensorFlow) grayscale weights for R, G, B.
GRAY_WEIGHTS = (0.2989, 0.5870, 0.1140)
#: S4's grayscale normalisation, in 0..255 units.
GRAY_MEAN, GRAY_STD = 122.6, 61.0
#: CIFAR-10 per-channel statistics on the [0, 1] scale (as in the S4 code).
RGB_MEAN = (0.4914, 0.4822, 0.4465)
RGB_STD = (0.247, 0.243, 0.261)

CIFAR_SUBDIR = Path("cifar10") / "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
N_VAL = 5000
OBTAIN = (
    "download the CIFAR-10 python version (cifar-10-python.tar.gz) from "
    "https://www.cs.toronto.edu/~kriz/cifar.html and extract it into <data_dir>/cifar10/"
)


# ------------------------------------------------------------------------------------------------
# readers and conversions (plain functions on numpy arrays)
# ------------------------------------------------------------------------------------------------
def read_cifar_batch(path: str | Path, skip_bad: bool = False) -> tuple[np.ndarray, np.ndarray, int]:
    """Read one CIFAR-10 pickle batch.

    Returns ``(data, labels, n_skipped)``: uint8 (N, 3072) in the file's channel-plane layout,
    int64 (N,) labels in 0..9, and the number of samples dropped for a label outside 0..9 (only
    with ``skip_bad``; otherwise such a sample raises :class:`DataFormatError` naming it).
    """
    path = Path(path)
    if not path.is_file():
        raise DataMissingError(f"missing CIFAR-10 batch {path}; {OBTAIN}")
    batch = load_data_pickle(path)  # plain values and numpy arrays only; DataFormatError otherwise
    if not isinstance(batch, dict):
        raise DataFormatError(f"expected a pickled dict, found {type(batch).__name__}", path)
    for key in (b"data", b"labels"):
        if key not in batch and key.decode() not in batch:
            raise DataFormatError(f"missing key {key!r} (keys: {sorted(map(str, batch))})", path)
    data = np.asarray(batch.get(b"data", batch.get("data")))
    labels = np.asarray(batch.get(b"labels", batch.get("labels")), dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        raise DataFormatError(f"b'data' must be uint8 of shape (N, 3072), found {data.dtype} {data.shape}", path)
    if labels.shape != (data.shape[0],):
        raise DataFormatError(f"b'labels' has shape {labels.shape}, expected ({data.shape[0]},) to match b'data'", path)
    bad = np.flatnonzero((labels < 0) | (labels > 9))
    if bad.size and not skip_bad:
        i = int(bad[0])
        raise DataFormatError(f"sample {i}: label {int(labels[i])} outside 0..9", path)
    keep = np.ones(len(labels), dtype=bool)
    keep[bad] = False
    return data[keep], labels[keep], int(bad.size)


def planes_to_pixels(data: np.ndarray) -> np.ndarray:
    """uint8 (N, 3072) channel planes -> uint8 (N, 1024, 3): pixels in raster order, RGB last."""
    n = data.shape[0]
    return np.ascontiguousarray(data.reshape(n, 3, 1024).transpose(0, 2, 1))


def rgb_to_gray_lra(rgb: np.ndarray) -> np.ndarray:
    """LRA's grayscale of uint8 RGB (..., 3) -> uint8 (...).

    ``trunc((0.2989 R + 0.5870 G + 0.1140 B) / 255 * 255.5)``, computed in float64 (TensorFlow
    works in float32; the two agree except possibly on values within ~1e-5 of an integer).
    """
    if rgb.dtype != np.uint8 or rgb.shape[-1] != 3:
        raise ValueError(f"expected uint8 (..., 3), got {rgb.dtype} {rgb.shape}")
    flt = rgb.astype(np.float64) / 255.0
    gray = flt @ np.asarray(GRAY_WEIGHTS, dtype=np.float64)
    return np.clip(np.trunc(gray * 255.5), 0, 255).astype(np.uint8)


def read_cifar10(root: str | Path, skip_bad: bool = False) -> dict[str, object]:
    """Read the CIFAR-10 batches under ``root`` (the ``cifar-10-batches-py`` directory).

    Returns ``{"train_pixels": uint8 (50000, 1024, 3), "train_labels": int64 (50000,),
    "test_pixels", "test_labels", "skipped": {file: count}}``.
    """
    root = Path(root)
    out: dict[str, object] = {"skipped": {}}
    for split, names in (("train", TRAIN_BATCHES), ("test", (TEST_BATCH,))):
        datas, labels = [], []
        for name in names:
            d, y, n_bad = read_cifar_batch(root / name, skip_bad=skip_bad)
            if n_bad:
                out["skipped"][str(root / name)] = n_bad  # type: ignore[index]
            datas.append(d)
            labels.append(y)
        out[f"{split}_pixels"] = planes_to_pixels(np.concatenate(datas))
        out[f"{split}_labels"] = np.concatenate(labels)
    return out


def split_train_val(n: int, n_val: int, seed: int) -> tuple[Tensor, Tensor]:
    """Indices (train, val) of a seeded random split: the last ``n_val`` of ``randperm(n)`` validate."""
    if not 0 < n_val < n:
        raise DataFormatError(f"cannot split {n} training samples into a validation set of {n_val}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))
    return perm[: n - n_val], perm[n - n_val :]


# ------------------------------------------------------------------------------------------------
# dataset over a uint8 pixel store
# ------------------------------------------------------------------------------------------------
class PixelDataset(Dataset):
    """Items ``{"inputs", "target"}`` converted on access from a compact uint8 store.

    Args:
        pixels: uint8 (N, L, C) pixel values.
        labels: int64 (N,) class indices.
        kind: ``"tokens"`` -> LongTensor (L,) ids ``level + 5`` (requires C == 1);
            ``"numeric"`` -> float32 (L, C) ``(x - mean) / std`` per channel (0..255 units).
        mean, std: per-channel statistics for ``numeric`` (length C), in 0..255 units.
        index: optional LongTensor of the store rows this dataset exposes, in order.
    """

    def __init__(self, pixels: Tensor, labels: Tensor, kind: str, mean=None, std=None, index: Tensor | None = None):
        if pixels.dtype != torch.uint8 or pixels.dim() != 3:
            raise ValueError(f"pixels must be uint8 (N, L, C), got {pixels.dtype} {tuple(pixels.shape)}")
        if kind not in ("tokens", "numeric"):
            raise ValueError(f"kind must be 'tokens' or 'numeric', got {kind!r}")
        if kind == "tokens" and pixels.shape[2] != 1:
            raise ValueError("token inputs need a single channel")
        self.pixels, self.labels, self.kind = pixels, labels.long(), kind
        self.index = index if index is not None else torch.arange(pixels.shape[0])
        c = pixels.shape[2]
        self.mean = torch.tensor(mean if mean is not None else [0.0] * c, dtype=torch.float32)
        self.std = torch.tensor(std if std is not None else [1.0] * c, dtype=torch.float32)

    def __len__(self) -> int:
        return int(self.index.numel())

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        row = int(self.index[i])
        x = self.pixels[row]
        if self.kind == "tokens":
            inputs = x[:, 0].long() + FIRST_TOKEN_ID
        else:
            inputs = (x.float() - self.mean) / self.std
        return {"inputs": inputs, "target": self.labels[row]}


def level_vocabulary():
    """The 256-level pixel vocabulary (tokens "0".."255" after the specials)."""
    return Vocabulary([str(i) for i in range(256)], strict=True)


# ------------------------------------------------------------------------------------------------
# tasks
# ------------------------------------------------------------------------------------------------
_VARIANTS = {
    # name: (input kind, channels, description)
    "image": ("tokens", 1, "LRA Image: CIFAR-10 grayscale (LRA formula), 1024 tokens of 256 levels, 10 classes"),
    "image-numeric": ("numeric", 1, "CIFAR-10 grayscale (LRA formula), numeric (1024, 1), (gray - 122.6) / 61.0"),
    "scifar": ("numeric", 3, "sequential CIFAR-10, RGB numeric (1024, 3), per-channel CIFAR-10 mean/std"),
}
LAYOUT = "cifar10/cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}"


def _spec(name: str):
    from longrange.data.spec import TaskSpec

    kind, channels, description = _VARIANTS[name]
    return TaskSpec(
        name=name,
        input_kind=kind,
        seq_len=1024,
        n_classes=10,
        metric="accuracy",
        mask_ratio=0.5,
        d_input=channels,
        description=description,
        layout=LAYOUT,
        obtain=OBTAIN,
    )


def load_cifar_task(name: str, data_dir: Path, seed: int = 0, skip_bad: bool = False):
    """Load one of ``image``, ``image-numeric``, ``scifar`` (see the module docstring) as TaskData."""
    from longrange.data.dataset import TaskData

    spec = _spec(name)
    root = Path(data_dir) / CIFAR_SUBDIR
    if not root.is_dir():
        raise DataMissingError(f"missing CIFAR-10 directory {root}; {OBTAIN}")
    raw = read_cifar10(root, skip_bad=skip_bad)
    kind = spec.input_kind
    stores = {}
    for split in ("train", "test"):
        rgb = raw[f"{split}_pixels"]
        pix = rgb if name == "scifar" else rgb_to_gray_lra(rgb)[..., None]  # type: ignore[index]
        stores[split] = (torch.from_numpy(np.ascontiguousarray(pix)), torch.from_numpy(raw[f"{split}_labels"]))
    if name == "scifar":
        mean, std = [255.0 * m for m in RGB_MEAN], [255.0 * s for s in RGB_STD]
    elif name == "image-numeric":
        mean, std = [GRAY_MEAN], [GRAY_STD]
    else:
        mean = std = None
    train_idx, val_idx = split_train_val(stores["train"][0].shape[0], N_VAL, seed)
    train = PixelDataset(*stores["train"], kind=kind, mean=mean, std=std, index=train_idx)
    val = PixelDataset(*stores["train"], kind=kind, mean=mean, std=std, index=val_idx)
    test = PixelDataset(*stores["test"], kind=kind, mean=mean, std=std)
    return TaskData(
        spec=spec,
        train=train,
        val=val,
        test=test,
        vocab=level_vocabulary() if kind == "tokens" else None,
        skipped=dict(raw["skipped"]),  # type: ignore[arg-type]
        info={"source": str(root), "sizes": {"train": len(train), "val": len(val), "test": len(test)}},
    )


def expected_paths(data_dir: Path, **_) -> list[Path]:
    """The files the CIFAR tasks read."""
    root = Path(data_dir) / CIFAR_SUBDIR
    return [root / n for n in (*TRAIN_BATCHES, TEST_BATCH)]


def _register() -> None:
    from longrange.data.registry import register_task

    for task_name in _VARIANTS:
        register_task(
            task_name,
            (lambda n: lambda **_: _spec(n))(task_name),
            (
                lambda n: (
                    lambda data_dir, spec, seed=0, skip_bad=False, **_: load_cifar_task(n, data_dir, seed, skip_bad)
                )
            )(task_name),
            {},
            expected=expected_paths,
        )


_register()
