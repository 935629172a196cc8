"""Writing files that are never left half-written, and output directories that can be created.

:func:`atomic_write` writes to a temporary file beside the target, fsyncs it and renames it over
the target (``os.replace``): a crash at any point leaves the old file or the new one, never a
truncated one. :func:`write_json` does so for strict JSON (non-finite floats become ``null``).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable

from longrange.errors import ConfigError


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some platforms cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[Any], None]) -> Path:
    """Call ``write(file)`` on a temporary file beside ``path``, then move it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def finite_or_none(value: Any) -> Any:
    """``value`` with every non-finite float (in nested dicts, lists and tuples) replaced by None,
    so that it is always valid JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def write_json(path: str | os.PathLike, data: Any, indent: int | None = 2) -> Path:
    """Write ``data`` as strict JSON (non-finite floats as null), atomically."""
    text = json.dumps(finite_or_none(data), indent=indent, allow_nan=False).encode()
    return atomic_write(path, lambda f: f.write(text))


def check_out_dir(path: str | os.PathLike, what: str = "--out") -> Path:
    """``path`` as a directory that exists or can be created; a ConfigError if a file is in the way."""
    path = Path(path)
    for parent in (path, *path.parents):
        if parent.exists():
            if not parent.is_dir():
                where = "" if parent == path else f" (its parent {parent} is a file)"
                raise ConfigError(f"{what} {path} is not a directory{where}; choose another {what}")
            break
    return path
