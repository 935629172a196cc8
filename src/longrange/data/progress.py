"""A progress bar for long data jobs: shown on an interactive terminal, silent otherwise."""

from __future__ import annotations

import sys

from tqdm import tqdm


def progress_bar(total: int | None, desc: str, quiet: bool = False, unit: str = "it") -> tqdm:
    """A tqdm bar on stderr, disabled when ``quiet`` or when stderr is not a terminal (logs, CI)."""
    disable = quiet or not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty())
    return tqdm(total=total, desc=desc, unit=unit, disable=disable, file=sys.stderr, dynamic_ncols=True)
