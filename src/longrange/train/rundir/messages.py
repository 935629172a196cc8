"""Lines about run directories that several commands show: the ways on from a checkpoint that
cannot be read (checkpoint loading, ``--resume``), and how many runs another longrange version made
(``compare`` and the report).
"""

from __future__ import annotations

from pathlib import Path

from longrange import __version__
from longrange.train.rundir.layout import BEST_WEIGHTS, LAST_CHECKPOINT


def ways_on(path: Path) -> str:
    """The ways on from an unreadable checkpoint: for a run's ``last.pt``, its best weights
    (``best.safetensors`` beside it) and ``--overwrite``."""
    if path.name != LAST_CHECKPOINT:
        return ""
    best = path.parent / BEST_WEIGHTS
    if best.is_file():
        keep = f"the run's best weights so far are intact in {best} (loadable as model weights)"
    else:
        keep = f"the run has no best weights yet ({best} does not exist)"
    return f"; the run cannot be resumed from it: {keep}; run again with --overwrite to start it afresh"


def other_versions_line(versions: list[str | None], noun: str = "stages") -> str:
    """ "3 of 20 stages were made by longrange 0.1.0" for the finished runs among ``versions`` (each
    run's :meth:`RunDir.made_by`, None when unfinished) made by another longrange; '' when none."""
    others: dict[str, int] = {}
    for version in versions:
        if version is not None and version != __version__:
            others[version] = others.get(version, 0) + 1
    return "; ".join(f"{k} of {len(versions)} {noun} were made by longrange {v}" for v, k in sorted(others.items()))
