"""Atomic checkpoints that load with ``torch.load(weights_only=True)``, and RNG state capture.

A checkpoint is a dict of tensors and plain containers (dict, list, tuple, str, int, float, bool,
None) only, so loading never runs code from the file: a file whose pickle asks to call anything
else is refused with a :class:`~longrange.errors.CheckpointError`.

Writes are atomic: the bytes go to a temporary file in the same directory, which is fsync-ed and
then renamed over the target with ``os.replace``. A crash at any point leaves either the old or the
new checkpoint, never a truncated one.
"""

from __future__ import annotations

import io
import os
import pickle
import random
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from longrange import __version__
from longrange.errors import CheckpointError
from longrange.fileio import atomic_write
from longrange.train.rundir import RunDir, ways_on

#: Version of the checkpoint layout written by :func:`save_checkpoint`; a newer one is refused.
FORMAT_VERSION = 1


def save_checkpoint(state: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write ``state`` (tensors and plain containers only) atomically to ``path``."""
    state = {"format": FORMAT_VERSION, "longrange": __version__, **state}
    buffer = io.BytesIO()  # serialised first: a full disk then fails in our writer, in our words
    torch.save(state, buffer)
    return atomic_write(path, buffer.getvalue())


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`, refusing anything but data.

    Every failure is a :class:`CheckpointError` in this project's words: a file that asks to call
    code is refused naming what it asks for (never suggesting an unrestricted load); a truncated
    or corrupt ``last.pt`` names the run's best weights (``best.safetensors``, still usable) and
    ``--overwrite`` as the ways on.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        refused = refused_global(str(err))
        if refused is not None:
            raise CheckpointError(
                f"refusing to load {path}: the file asks to call {refused}, which a checkpoint never holds "
                "(loading it could execute code); only tensors and plain containers are loaded. "
                "Use checkpoints written by longrange, or weights in a .safetensors file"
            ) from None
        raise CheckpointError(f"cannot read checkpoint {path}: not a checkpoint or corrupt{ways_on(path)}") from None
    except Exception:  # truncated or corrupt: torch raises RuntimeError, OSError, EOFError, KeyError, ...
        raise CheckpointError(
            f"cannot read checkpoint {path}: the file is truncated or corrupt{ways_on(path)}"
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a checkpoint dict")
    return state


def refused_global(message: str) -> str | None:
    """The ``module.name`` a weights-only load refused, from torch's error text (any version:
    "Unsupported global: GLOBAL x.y", "Trying to load unsupported GLOBAL x.y whose module ...");
    None when the error is not about a global."""
    match = re.search(r"GLOBAL\s+([A-Za-z_][\w.]*)", message)
    return match.group(1) if match else None


# --------------------------------------------------------------------------- model weights
def save_safetensors(state_dict: Mapping[str, Tensor], path: str | os.PathLike) -> Path:
    """Write model weights to a ``.safetensors`` file atomically.

    Tied parameters are written once per name (cloned), because the format cannot share storage;
    loading gives back every key of the state dict.
    """
    from safetensors.torch import save as st_save

    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state_dict.items()}
    data = st_save(tensors, metadata={"format": "pt"})
    return atomic_write(path, data)


def load_weights(
    path: str | os.PathLike, model: nn.Module | None = None, map_location: Any = "cpu"
) -> dict[str, Tensor]:
    """Model weights from a ``.pt`` checkpoint (its ``model`` entry) or a ``.safetensors`` file.

    With ``model`` given, the weights are also loaded into it (strictly: missing or unexpected
    keys and shape mismatches raise a CheckpointError naming them).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no weights file at {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            weights = load_file(str(path), device=str(map_location) if map_location is not None else "cpu")
        except Exception as err:
            raise CheckpointError(f"cannot read safetensors file {path}: {err}") from None
    else:
        state = load_checkpoint(path, map_location=map_location)
        if "model" not in state:
            raise CheckpointError(f"{path} has no 'model' entry (keys: {', '.join(map(str, state))})")
        weights = state["model"]
    if model is not None:
        load_model_weights(model, weights, source=path)
    return weights


def load_model_weights(model: nn.Module, weights: Mapping[str, Tensor], source: object = "checkpoint") -> None:
    """``model.load_state_dict(weights)`` with a CheckpointError that names what does not fit."""
    own = model.state_dict()
    missing = [k for k in own if k not in weights]
    unexpected = [k for k in weights if k not in own]
    shapes = [
        f"{k}: model {tuple(own[k].shape)} vs file {tuple(weights[k].shape)}"
        for k in own
        if k in weights and tuple(own[k].shape) != tuple(weights[k].shape)
    ]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing keys {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        if unexpected:
            parts.append(f"unexpected keys {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
        if shapes:
            parts.append(f"shape mismatches {shapes[:8]}{' ...' if len(shapes) > 8 else ''}")
        raise CheckpointError(f"weights in {source} do not fit the model: " + "; ".join(parts))
    model.load_state_dict(weights)


# --------------------------------------------------------------------------- a run's checkpoints
class Checkpointer:
    """A run's checkpoints: ``last.pt`` (everything needed to continue exactly) and the best weights
    (``best.safetensors``), both written atomically."""

    def __init__(self, run: RunDir):
        self.run = run
        #: The step of the last checkpoint written or resumed from (None: none yet).
        self.step: int | None = None

    def save(self, state: Mapping[str, Any], best: bool = False) -> Path:
        """Write ``state`` as the last checkpoint, and its ``model`` entry as the best weights if ``best``."""
        if best:
            save_safetensors(state["model"], self.run.best_weights)
        path = save_checkpoint(state, self.run.last)
        self.step = int(state["trainer"]["step"]) if "trainer" in state else None
        return path

    def load(self, map_location: Any = "cpu") -> dict[str, Any]:
        """The last checkpoint; one in a newer format than :data:`FORMAT_VERSION` is refused naming both."""
        state = load_checkpoint(self.run.last, map_location=map_location)
        version = state.get("format", 1)
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise CheckpointError(
                f"{self.run.last} is in checkpoint format {version} (written by longrange "
                f"{state.get('longrange', 'unknown')}); this longrange {__version__} reads formats up to "
                f"{FORMAT_VERSION}: resume it with the longrange that wrote it, or start afresh with --overwrite"
            )
        return state

    def load_best(self) -> dict[str, Tensor] | None:
        """The best weights so far, or None."""
        return load_weights(self.run.best_weights) if self.run.best_weights.is_file() else None

    def last_good(self) -> str:
        """``; the last good checkpoint is ...`` for error messages ('' before the first)."""
        if not self.run.last.is_file():
            return ""
        return f"; the last good checkpoint is {self.run.last}" + (
            f" (step {self.step})" if self.step is not None else ""
        )


# --------------------------------------------------------------------------- RNG state
def rng_state() -> dict[str, Any]:
    """The python, numpy, torch CPU and CUDA generator states, as tensors and plain values."""
    version, internal, gauss = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "kind": np_kind,
            "keys": torch.from_numpy(np_keys.astype(np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "gauss": float(np_gauss),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["internal"].tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state(
        (npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"], npy["gauss"])
    )
    torch.set_rng_state(state["torch"].to("cpu"))
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available():
        if len(cuda) != torch.cuda.device_count():
            # Another machine: the CUDA streams cannot continue exactly; keep the current ones.
            warnings.warn(
                f"the checkpoint holds RNG states of {len(cuda)} CUDA devices, this machine has "
                f"{torch.cuda.device_count()}; CUDA random numbers will not continue the saved run exactly",
                stacklevel=2,
            )
            return
        torch.cuda.set_rng_state_all([s.to("cpu") for s in cuda])
