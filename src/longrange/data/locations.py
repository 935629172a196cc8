"""Where data lives: the root data directory (``data_dir``, else ``$LONGRANGE_DATA``, else
``./data``) and each task's folder inside it (see ``docs/data.md``)."""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable naming the default data directory.
DATA_ENV = "LONGRANGE_DATA"


def default_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """``data_dir`` if given, else ``$LONGRANGE_DATA``, else ``./data``."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    return Path(os.environ.get(DATA_ENV) or "data").expanduser()


def task_dir(data_dir: Path, subdir: str, probe: str) -> Path:
    """The directory of a task's files: ``data_dir/subdir``, or ``data_dir`` itself when it holds
    ``probe`` directly (the user pointed the data dir at the task's own folder)."""
    nested = data_dir / subdir
    if not (nested / probe).exists() and (data_dir / probe).exists():
        return data_dir
    return nested
