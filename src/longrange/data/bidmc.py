"""BIDMC vital-sign regression (heart rate, respiratory rate, oxygen saturation) from PPG and ECG.

Layout: the ``.npy`` arrays produced by the S4 repository's ``prepare/bidmc/process_data.py`` from
the Monash BIDMC32{HR,RR,SpO2} archives::

    <data_dir>/bidmc/<target>/<split>/{trainx,trainy,validx,validy,testx,testy}.npy

``<target>`` is ``HR``, ``RR`` or ``SpO2``; ``<split>`` is ``reshuffle`` (default; the S4 and SPT
configs use it: train/test pooled and re-split 70/15/15) or ``original``. Files placed directly in
``bidmc/<target>/`` are accepted too. ``*x.npy`` is float (N, 4000, 2) (two signals, 4000 steps at
125 Hz), ``*y.npy`` is float (N,) or (N, 1).

Tasks: ``bidmc`` (option ``target``, default ``RR`` as in S4) and the fixed-target names
``bidmc-hr``, ``bidmc-rr``, ``bidmc-spo2``. Inputs float (4000, 2); targets float (1,); metric r2.
No normalisation of inputs or targets, as in the S4 loader. mask_ratio 0.25 (SPT configs).
A sample with a non-finite value is an error (or skipped with ``skip_bad``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from longrange.errors import ConfigError, DataFormatError, DataMissingError

TARGETS = ("HR", "RR", "SpO2")
LENGTH, CHANNELS = 4000, 2
SPLITS = (("train", "trainx", "trainy"), ("val", "validx", "validy"), ("test", "testx", "testy"))
OBTAIN = (
    "download BIDMC32HR/RR/SpO2 (_TRAIN.ts, _TEST.ts) from the Monash regression archive "
    "(zenodo records 4001456, 4001463, 4001464) and convert them with the S4 repository's "
    "src/dataloaders/prepare/bidmc/process_data.py into <data_dir>/bidmc/<target>/reshuffle/"
)


def _target(target: str) -> str:
    for t in TARGETS:
        if str(target).lower() == t.lower():
            return t
    raise ConfigError(f"target: must be one of {', '.join(TARGETS)}, got {target!r}")


def _split_name(split: str) -> str:
    if split not in ("reshuffle", "original"):
        raise ConfigError(f"split: must be 'reshuffle' or 'original', got {split!r}")
    return split


def find_bidmc_dir(data_dir: str | Path, target: str, split: str = "reshuffle") -> Path:
    """``bidmc/<target>/<split>`` if it holds ``trainx.npy``, else ``bidmc/<target>`` if that does."""
    base = Path(data_dir) / "bidmc" / _target(target)
    nested = base / _split_name(split)
    for d in (nested, base):
        if (d / "trainx.npy").is_file():
            return d
    raise DataMissingError(f"missing BIDMC arrays: expected {nested}/trainx.npy (or {base}/trainx.npy); {OBTAIN}")


def _load_array(path: Path) -> np.ndarray:
    if not path.is_file():
        raise DataMissingError(f"missing {path}; {OBTAIN}")
    try:
        arr = np.load(path, allow_pickle=False)
    except Exception as exc:  # ValueError for object arrays, OSError/UnpicklingError for junk
        raise DataFormatError(f"not a readable numeric .npy array ({type(exc).__name__}: {exc})", path) from exc
    if not isinstance(arr, np.ndarray) or not np.issubdtype(arr.dtype, np.number):
        raise DataFormatError(f"expected a numeric array, found dtype {getattr(arr, 'dtype', type(arr))}", path)
    return arr


def read_bidmc_split(x_path: Path, y_path: Path, skip_bad: bool = False) -> tuple[torch.Tensor, torch.Tensor, int]:
    """One split: inputs float32 (N, 4000, 2), targets float32 (N, 1), and the number skipped."""
    x, y = _load_array(x_path), _load_array(y_path)
    if x.ndim != 3 or x.shape[1:] != (LENGTH, CHANNELS):
        raise DataFormatError(f"inputs have shape {x.shape}, expected (N, {LENGTH}, {CHANNELS})", x_path)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise DataFormatError(f"targets have shape {y.shape}, expected (N,) or (N, 1)", y_path)
    if y.shape[0] != x.shape[0]:
        raise DataFormatError(
            f"{y.shape[0]} targets for {x.shape[0]} inputs in {x_path.name} (shape {x.shape})", y_path
        )
    finite = np.isfinite(x).all(axis=(1, 2)) & np.isfinite(y)
    bad = np.flatnonzero(~finite)
    if bad.size and not skip_bad:
        i = int(bad[0])
        where = x_path if not np.isfinite(x[i]).all() else y_path
        raise DataFormatError(f"sample {i} has a non-finite value", where)
    x, y = x[finite], y[finite]
    return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.float32)).unsqueeze(-1), int(bad.size)


def bidmc_spec(name: str = "bidmc", target: str = "RR", split: str = "reshuffle"):
    from longrange.data.spec import TaskSpec

    t = _target(target)
    _split_name(split)
    return TaskSpec(
        name=name,
        input_kind="numeric",
        seq_len=LENGTH,
        n_classes=0,
        metric="r2",
        mask_ratio=0.25,
        d_input=CHANNELS,
        n_targets=1,
        description=f"BIDMC {t} regression from PPG+ECG (4000 steps at 125 Hz, 2 channels), metric R^2",
        layout=f"bidmc/{t}/{split}/{{trainx,trainy,validx,validy,testx,testy}}.npy",
        obtain=OBTAIN,
    )


def load_bidmc(
    data_dir: Path, spec, seed: int = 0, skip_bad: bool = False, target: str = "RR", split: str = "reshuffle"
):
    """Load one BIDMC target as TaskData (arrays are small; no cache)."""
    from longrange.data.dataset import SequenceDataset, TaskData

    d = find_bidmc_dir(data_dir, target, split)
    parts, skipped = {}, {}
    for name, xs, ys in SPLITS:
        x, y, n_bad = read_bidmc_split(d / f"{xs}.npy", d / f"{ys}.npy", skip_bad)
        if n_bad:
            skipped[str(d / f"{xs}.npy")] = n_bad
        parts[name] = SequenceDataset(list(x), y)
    return TaskData(
        spec=spec,
        train=parts["train"],
        val=parts["val"],
        test=parts["test"],
        vocab=None,
        skipped=skipped,
        info={"source": str(d), "sizes": {k: len(v) for k, v in parts.items()}},
    )


def expected_paths(data_dir: Path, target: str = "RR", split: str = "reshuffle", **_) -> list[Path]:
    d = Path(data_dir) / "bidmc" / _target(target) / split
    return [d / f"{n}.npy" for _, xs, ys in SPLITS for n in (xs, ys)]


def _register() -> None:
    from longrange.data.registry import register_task

    register_task(
        "bidmc",
        lambda **o: bidmc_spec("bidmc", **o),
        lambda data_dir, spec, seed=0, skip_bad=False, **o: load_bidmc(data_dir, spec, seed, skip_bad, **o),
        {"target": "RR", "split": "reshuffle"},
        expected=expected_paths,
    )
    for t in TARGETS:
        name = f"bidmc-{t.lower()}"
        register_task(
            name,
            (lambda n, tt: lambda **o: bidmc_spec(n, target=tt, **o))(name, t),
            (
                lambda tt: (
                    lambda data_dir, spec, seed=0, skip_bad=False, **o: load_bidmc(
                        data_dir, spec, seed, skip_bad, target=tt, **o
                    )
                )
            )(t),
            {"split": "reshuffle"},
            expected=(lambda tt: lambda data_dir, **o: expected_paths(data_dir, target=tt, **o))(t),
        )


_register()
