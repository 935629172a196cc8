"""Writing files that are never left half-written, and output directories that can be created.

:func:`atomic_write` writes to a temporary file beside the target, fsyncs it and renames it over
the target (``os.replace``): a crash at any point leaves the old file or the new one, never a
truncated one. :func:`write_json` does so for strict JSON (non-finite floats become ``null``).

A file system without atomic renames, a full disk or a copy cut short can still leave a prefix of
a file. JSON cannot hide that (a cut object does not parse), but YAML can: a prefix of a YAML
mapping is often a smaller valid mapping. :func:`seal` puts a first line on a text file that records
the length and a hash of the rest (``# longrange-sealed: 1234 bytes, sha256 0123456789abcdef``, a
comment to every YAML reader), and :func:`unseal` checks it: any cut, at any offset, and any
altered byte is an error naming the file, never a smaller file read as whole.
A full disk, a read-only file system or a missing permission is a :class:`DiskWriteError` in one
line naming the file and the reason, with nothing half-written left behind.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any, BinaryIO

from longrange.errors import ConfigError, DataFormatError, DiskWriteError

#: The first line of a sealed file: ``SEAL_PREFIX`` + "<n> bytes, sha256 <16 hex digits>".
SEAL_PREFIX = b"# longrange-sealed: "
_SEAL_LINE = re.compile(rb"# longrange-sealed: (\d+) bytes, sha256 ([0-9a-f]{16})")


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


def _digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()[:16]


def seal(text: str) -> bytes:
    """``text`` encoded, after a first line recording its length and hash (see :func:`unseal`)."""
    body = text.encode()
    return SEAL_PREFIX + f"{len(body)} bytes, sha256 {_digest(body)}\n".encode() + body


def unseal(data: bytes, path: str | os.PathLike) -> str:
    """The text that :func:`seal` sealed in ``data`` (the bytes of ``path``), checked: a
    :class:`DataFormatError` naming ``path`` if it was cut short or altered. Text without a seal
    (written before seals existed, or by hand) is returned as it is."""
    first, newline, body = data.partition(b"\n")
    if not (first.startswith(SEAL_PREFIX) or (first and SEAL_PREFIX.startswith(first) and not newline)):
        return data.decode()
    match = _SEAL_LINE.fullmatch(first)
    if not newline or match is None:
        raise DataFormatError("cut short: its integrity line is incomplete", path, 1)
    size, digest = int(match.group(1)), match.group(2).decode()
    if len(body) != size:
        raise DataFormatError(f"cut short or extended: {len(body)} bytes where {size} were written", path)
    if _digest(body) != digest:
        raise DataFormatError("damaged: its content does not match the hash written with it", path)
    return body.decode()


def is_number(v: Any) -> bool:
    """Whether ``v`` read from JSON or YAML is a number: an int or a float, never a flag (``bool``)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def json_field(
    d: Any, name: str, kinds: tuple[type, ...], path: object = None, *, optional: bool = False, prefix: str = ""
) -> Any:
    """Field ``name`` of a record read from JSON or YAML (``d``, read from ``path``), checked to be of
    one of ``kinds``: a missing or mistyped field is a :class:`DataFormatError` naming the file and
    the field (``prefix``: its section, e.g. ``"head."``); None for an absent or null ``optional``
    field. A flag is never a count and a count never a flag (``bool`` is not taken for ``int``)."""
    if name not in d or d[name] is None:
        if optional:
            return None
        raise DataFormatError(f"missing field '{prefix}{name}'", path)
    v = d[name]
    if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise DataFormatError(f"field '{prefix}{name}' must be {names}, got {type(v).__name__} {v!r}", path)
    return v
