"""Is a task's data there? One question, one answer: :func:`data_state` returns a :class:`DataState`.

Without loading anything, it says whether the data is drawn when the task is loaded (nothing on
disk), generated (built on first use, or built already), or read from files (present, or missing,
with the first missing file and how to obtain it); which files the task lists and whether each is
there (``longrange data info``); the task's own files that generated data leaves unread (the note
of ``compare``); and what identifies the data a run reads (:meth:`DataState.identity`, recorded
with every run).

:func:`task_status` and :func:`data_identity` are two readings of it under the names that
``longrange.data`` exports, kept for the code that calls them.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longrange import smoke
from longrange.data.cache import _source_fingerprint
from longrange.data.generated import GENERATED_MANIFEST, generated_configuration, generated_root
from longrange.data.locations import default_data_dir
from longrange.data.registry import resolved_options, task_entry

#: What a generated task records as its data directory (it reads none).
DRAWN_WHEN_LOADED = "(generated)"


@dataclass(frozen=True)
class DataState:
    """Where a task's data stands, without loading it (:func:`data_state`)."""

    task: str
    present: bool  # the loader finds its data (drawn when loaded, built, or every listed file there)
    generated: bool  # drawn when loaded, or built on first use from a generator
    root: Path  # the directory the loader reads (``DRAWN_WHEN_LOADED``: none)
    missing: tuple[Path, ...]  # what is not there: listed files, or the generated directory not yet built
    obtain: str  # how to get the missing files (for data that cannot be generated)
    data_dir: Path  # the root data directory (``root`` itself for data read from files)
    #: Each path the task lists under ``root`` (as its file list gives it) and whether it is there;
    #: ``root`` alone for a task without a file list, nothing for data drawn when loaded.
    files: tuple[tuple[Path, bool], ...] = ()
    listed: bool = False  # the task has a file list
    #: The task's own listed files present in ``data_dir``: read unless generated data is asked for.
    own_files: tuple[Path, ...] = ()
    generator_version: int | None = None  # data drawn when loaded: the version of what draws it
    configuration: str | None = None  # generated data: ``<configuration>-<hash of its options>``

    @property
    def files_found(self) -> bool:
        """Every path in :attr:`files` is there (true for data drawn when loaded)."""
        return all(found for _, found in self.files)

    def file_lines(self) -> list[str]:
        """One human-readable line per path in :attr:`files` (``longrange data info``)."""
        if self.generator_version is not None:
            return [f"generated when loaded (generator version {self.generator_version}); no files"]
        unlisted = "" if self.listed else " (no file list for this task)"
        return [f"{path}: {'found' if found else 'missing'}{unlisted}" for path, found in self.files]

    def describe(self, name: str) -> str:
        """One line on where the data of task ``name`` stands (``compare`` prints one per data set)."""
        if self.present and str(self.root) == DRAWN_WHEN_LOADED:
            return f"{name}: drawn when the task is loaded (nothing on disk)"
        if self.present:
            return f"{name}: present in {self.root}"
        if self.generated:
            return f"{name}: generated on first use into {self.root}"
        first = self.missing[0] if self.missing else self.root
        return f"{name}: MISSING {first}; {self.obtain}"

    def identity(self) -> dict[str, str]:
        """What identifies the data a run reads, without loading it: the resolved data directory and
        a hash of the task's listed files (resolved path, size and modification time of each file, as
        the cache keys; see ``data/cache.py``). Replacing or editing a file changes the hash.

        Data drawn when loaded reads no directory: its identity is the generator's version (its
        options and seed are in the run's task settings). Generated data is identified by its
        configuration instead (every generator option and the generator's version: the files are a
        function of them), so the identity is the same before the data is built, after, and after
        it is built again."""
        shrunk = {"smoke": smoke.IDENTITY} if smoke.active() else {}  # never the identity of the whole data
        if self.generator_version is not None:
            return {"dir": DRAWN_WHEN_LOADED, "generator": f"{self.task} v{self.generator_version}", **shrunk}
        if self.configuration is not None:
            return {"dir": str(self.data_dir.resolve()), "generated": self.configuration, **shrunk}
        rows: list = []
        if self.listed:
            for path, _ in self.files:
                rows.append(_source_fingerprint(Path(path)) if Path(path).exists() else [str(path), "missing"])
        text = json.dumps(rows, sort_keys=True, default=str)
        return {"dir": str(self.data_dir.resolve()), "files": hashlib.sha256(text.encode()).hexdigest()[:16], **shrunk}


def data_state(
    name: str, data_dir: str | os.PathLike | None = None, generate: str | Mapping[str, Any] | None = None, **options
) -> DataState:
    """Whether the task's data is present, will be generated on first use, or is missing (with the
    first missing file and how to obtain it), with every listed file and the data's identity.

    ``generate``: the generated configuration read instead of the task's files (see
    :func:`~longrange.data.loading.load_task`); unknown tasks, options and configurations are a
    ConfigError."""
    entry = task_entry(name)
    opts = resolved_options(name, options)
    base = default_data_dir(data_dir)
    if entry.generated is not None:  # drawn when loaded: nothing on disk, nothing missing
        return DataState(
            name,
            present=True,
            generated=True,
            root=Path(DRAWN_WHEN_LOADED),
            missing=(),
            obtain="",
            data_dir=base,
            generator_version=entry.generated,
        )

    def listed(root: Path) -> tuple[tuple[Path, bool], ...]:
        paths = entry.expected(root, **opts) if entry.expected is not None else [root]
        return tuple((path, Path(path).exists()) for path in paths)

    files = listed(base)
    own = tuple(Path(p) for p, found in files if found) if entry.expected is not None else ()
    if generate is not None:
        root = generated_root(name, data_dir, generate, opts)
        config, key, _ = generated_configuration(name, generate, opts)
        present = (root / GENERATED_MANIFEST).is_file()
        return DataState(
            name,
            present=present,
            generated=True,
            root=root,
            missing=() if present else (root,),
            obtain="",
            data_dir=base,
            files=listed(root),
            listed=entry.expected is not None,
            own_files=own,
            configuration=f"{config}-{key}",
        )
    missing = tuple(Path(p) for p, found in files if not found)
    obtain = entry.spec(**opts).obtain or "see `longrange data info " + name + "`"
    return DataState(
        name,
        present=not missing,
        generated=False,
        root=base,
        missing=missing,
        obtain=obtain,
        data_dir=base,
        files=files,
        listed=entry.expected is not None,
        own_files=own,
    )


def task_status(
    name: str, data_dir: str | os.PathLike | None = None, generate: str | Mapping[str, Any] | None = None, **options
) -> tuple[bool, list[str]]:
    """Whether the task's files are present, and one human-readable line per expected path
    (``generate``: of that generated configuration): :attr:`DataState.files_found` and
    :meth:`DataState.file_lines` of :func:`data_state`, under the name ``longrange.data`` exports."""
    state = data_state(name, data_dir, generate, **options)
    return state.files_found, state.file_lines()


def data_identity(
    name: str, data_dir: str | os.PathLike | None = None, generate: str | Mapping[str, Any] | None = None, **options
) -> dict[str, str]:
    """What identifies the data a run reads, without loading it: :meth:`DataState.identity` of
    :func:`data_state`, under the name the run records and ``longrange.data.tasks`` export."""
    return data_state(name, data_dir, generate, **options).identity()
