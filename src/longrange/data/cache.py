"""A cache of prepared (parsed, tokenised) data sets under ``<data_dir>/.cache``.

Parsing a published data set can take minutes; the prepared tensors load in seconds. An entry is
keyed by the task name, the loader's version, each source file's resolved path, size and
modification time, and the task options, so editing a source file or changing an option prepares
the data again. Entries are written atomically (a temporary file, then ``os.replace``) so
concurrent runs never read half a file, and are read with ``torch.load(weights_only=True)``: an
entry can only hold tensors, lists, dicts, strings and numbers.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from longrange.errors import DataMissingError, DiskWriteError
from longrange.fileio import atomic_write

#: Bumped when the layout of every entry changes (invalidates all caches).
CACHE_FORMAT_VERSION = 1


def cache_dir(data_dir: str | os.PathLike) -> Path:
    """``<data_dir>/.cache``, created on demand."""
    path = Path(data_dir) / ".cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _source_fingerprint(source: Path) -> list:
    """(path, size, mtime_ns) of a file, or of every file below a directory."""
    try:
        resolved = source.resolve(strict=True)
    except FileNotFoundError:
        raise DataMissingError(f"source file {source} not found") from None
    if resolved.is_dir():
        rows = []
        for root, dirs, files in os.walk(resolved):
            dirs.sort()
            for name in sorted(files):
                st = os.stat(os.path.join(root, name))
                rows.append([os.path.relpath(os.path.join(root, name), resolved), st.st_size, st.st_mtime_ns])
        return [str(resolved), rows]
    st = resolved.stat()
    return [str(resolved), st.st_size, st.st_mtime_ns]


def cache_key(name: str, sources: Sequence[str | os.PathLike], options: dict, version: int = 1) -> str:
    """Hex digest identifying a prepared data set (see the module docstring)."""
    payload = {
        "name": name,
        "format": CACHE_FORMAT_VERSION,
        "version": version,
        "sources": [_source_fingerprint(Path(s)) for s in sources],
        "options": options,
    }
    text = json.dumps(payload, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


def cache_path(
    data_dir: str | os.PathLike, name: str, sources: Sequence[str | os.PathLike], options: dict, version: int = 1
) -> Path:
    """Where the entry for these sources and options lives (the file may not exist)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return cache_dir(data_dir) / f"{safe}-{cache_key(name, sources, options, version)}.pt"


def _save(obj: dict, path: Path) -> None:
    """Write the entry atomically. A cache that cannot be written (a full disk, a read-only data
    directory) is not an error: the data is at hand; a line says why the next run prepares it again."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    try:
        atomic_write(path, buffer.getvalue())
    except DiskWriteError as err:
        print(
            f"warning: the prepared data is not cached ({err}); the next run prepares it again",
            file=sys.stderr,
            flush=True,
        )


def cached(
    data_dir: str | os.PathLike,
    name: str,
    sources: Sequence[str | os.PathLike],
    options: dict,
    build: Callable[[], dict],
    *,
    version: int = 1,
    rebuild: bool = False,
    quiet: bool = False,
) -> dict:
    """Return ``build()``'s dict, from the cache when an entry for these sources and options exists.

    Args:
        data_dir: the data directory; entries go to ``<data_dir>/.cache``.
        name: the task name (part of the key and of the file name).
        sources: files (or directories, fingerprinted file by file) the data is read from.
        options: the options the result depends on (JSON-serialisable values).
        build: makes the dict of tensors / lists / strings / numbers to store.
        version: the loader's version; bump it when the loader's output changes.
        rebuild: build and overwrite even when an entry exists.
        quiet: do not print the "preparing" line.
    """
    path = cache_path(data_dir, name, sources, options, version)
    if path.exists() and not rebuild:
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # a damaged entry is rebuilt, never trusted
            if not quiet:
                print(
                    f"cache entry {path} is unreadable ({type(err).__name__}); preparing {name} again",
                    file=sys.stderr,
                    flush=True,
                )
    elif not quiet:
        print(f"preparing {name} (first run) ...", file=sys.stderr, flush=True)
    result = build()
    if not isinstance(result, dict):
        raise TypeError(f"the build function of {name} must return a dict, got {type(result).__name__}")
    _save(result, path)
    return result
