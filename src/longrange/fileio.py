"""Writing files that are never left half-written, and output directories that can be created.

:func:`atomic_write` writes to a temporary file beside the target, fsyncs it and renames it over
the target (``os.replace``): a crash at any point leaves the old file or the new one, never a
truncated one. :func:`write_json` does so for strict JSON (non-finite floats become ``null``).
A full disk, a read-only file system or a missing permission is a :class:`DiskWriteError` in one
line naming the file and the reason, with nothing half-written left behind.
"""
from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path
from typing import Any, BinaryIO

from longrange.errors import ConfigError, DiskWriteError


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


#: Errors of the operating system, in words (``strerror`` for the others).
_REASONS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EIO: "input/output error",
}


def write_error(path: str | os.PathLike, err: OSError) -> DiskWriteError:
    """``cannot write PATH: no space left on device`` (or the OS error's own words)."""
    reason = _REASONS.get(err.errno, err.strerror or str(err))
    return DiskWriteError(f"cannot write {path}: {reason}", path, err.errno)


def _write_bytes(f: BinaryIO, data: bytes) -> None:
    """Every byte this module writes goes through here."""
    f.write(data)


def atomic_write(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to a temporary file beside ``path``, fsync it, then move it into place. A
    failure of the operating system is a :class:`DiskWriteError` naming ``path``; the temporary file
    is removed and the previous file (if any) is left as it was."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            _write_bytes(f, data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise write_error(path, err) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def append_text(path: str | os.PathLike, text: str) -> None:
    """Append ``text`` to ``path``; on a failure of the operating system the file is cut back to its
    previous length (no half line) and a :class:`DiskWriteError` names it."""
    path = Path(path)
    size = path.stat().st_size if path.exists() else 0
    try:
        with open(path, "ab") as f:
            _write_bytes(f, text.encode())
    except OSError as err:
        try:
            os.truncate(path, size)
        except OSError:
            pass
        raise write_error(path, err) from None


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
    return atomic_write(path, json.dumps(finite_or_none(data), indent=indent, allow_nan=False).encode())


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
