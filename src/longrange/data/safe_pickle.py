"""A restricted unpickler for data files that are published as pickles (the CIFAR-10 batches).

``pickle.load`` runs whatever callable a file names: a pickle is a small program, and a file that
asks for ``os.system`` gets it. :func:`load_data_pickle` allows only the structure these files are
published with and refuses everything else before it is called:

* plain values: dict, list, tuple, str, bytes, int, float, bool, None (opcodes, no globals);
* numpy arrays and scalars, through exactly the globals numpy's own pickles name:
  ``numpy.core.multiarray._reconstruct`` (numpy 1, and the Python 2 files of CIFAR-10) or
  ``numpy._core.multiarray._reconstruct`` (numpy 2), ``numpy.ndarray``, ``numpy.dtype``,
  ``numpy.core.multiarray.scalar`` / ``numpy._core.multiarray.scalar``, and for protocol 5
  ``numpy.core.numeric._frombuffer`` / ``numpy._core.numeric._frombuffer``;
* ``_codecs.encode``, which protocol-2 pickles written by Python 3 use to spell a ``bytes`` value
  (the arguments are a string and a codec name; no code is run).

Any other global (``os.system``, ``builtins.eval``, a class of some package, ...) raises
:class:`~longrange.errors.DataFormatError` naming the file and the refused global; nothing from
the file runs. Objects built by ``__setstate__`` are limited to the allowed classes above.
"""

from __future__ import annotations

import codecs
import io
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from longrange.errors import DataFormatError


def _numpy_global(module: str, name: str) -> Callable[[], Any]:
    """A resolver for a numpy reconstruction function, whichever numpy (1 or 2) is installed."""

    def resolve() -> Any:
        try:
            from numpy import _core as core  # numpy 2
        except ImportError:  # numpy 1
            from numpy import core  # type: ignore[no-redef]
        return getattr(getattr(core, module), name)

    return resolve


#: (module, name) -> a function returning the object; the only globals a data pickle may name.
ALLOWED_GLOBALS: dict[tuple[str, str], Callable[[], Any]] = {
    ("numpy", "ndarray"): lambda: np.ndarray,
    ("numpy", "dtype"): lambda: np.dtype,
    ("_codecs", "encode"): lambda: codecs.encode,
}
for _prefix in ("numpy.core", "numpy._core"):
    ALLOWED_GLOBALS[(f"{_prefix}.multiarray", "_reconstruct")] = _numpy_global("multiarray", "_reconstruct")
    ALLOWED_GLOBALS[(f"{_prefix}.multiarray", "scalar")] = _numpy_global("multiarray", "scalar")
    ALLOWED_GLOBALS[(f"{_prefix}.numeric", "_frombuffer")] = _numpy_global("numeric", "_frombuffer")
del _prefix


class RefusedGlobal(pickle.UnpicklingError):
    """The pickle names a global outside :data:`ALLOWED_GLOBALS`."""

    def __init__(self, module: str, name: str):
        super().__init__(f"{module}.{name}")
        self.module, self.name = module, name


class DataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` whose ``find_class`` serves :data:`ALLOWED_GLOBALS` only."""

    def find_class(self, module: str, name: str) -> Any:
        resolve = ALLOWED_GLOBALS.get((module, name))
        if resolve is None:
            raise RefusedGlobal(module, name)
        return resolve()

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError(f"persistent id {pid!r} (data pickles hold no external references)")


def loads_data_pickle(data: bytes, source: object = "<bytes>", encoding: str = "bytes") -> Any:
    """Unpickle ``data`` with :class:`DataUnpickler`; errors name ``source``."""
    try:
        return DataUnpickler(io.BytesIO(data), encoding=encoding).load()
    except RefusedGlobal as err:
        raise DataFormatError(
            f"refusing to unpickle: the file asks for {err.module}.{err.name}, which a data file never needs "
            "(loading it could run code); only plain values and numpy arrays are read",
            source,
        ) from None
    except Exception as err:  # truncated file, not a pickle, ...
        raise DataFormatError(f"not a readable pickle ({type(err).__name__}: {err})", source) from None


def load_data_pickle(path: str | Path, encoding: str = "bytes") -> Any:
    """The object pickled in the file at ``path``, refusing anything but plain values and numpy
    arrays (see the module docstring). ``encoding="bytes"`` reads Python 2 strings as bytes, as
    the CIFAR-10 files need."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise DataFormatError(f"cannot read ({err.strerror})", path) from None
    return loads_data_pickle(data, path, encoding=encoding)
