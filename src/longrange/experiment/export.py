"""A comparison's results without what can be made again: small enough to keep in a repository or
send, and complete enough to continue the comparison from.

``longrange compare --export OUT DEST`` (and :func:`export_results`) copies, from the comparison or
study in ``OUT`` (``compare``, ``mad``, ``zoology``: any directory with a ``plan.json``):

* every file outside the stages' run directories (the plan, a study's settings, its reports);
* each finished stage's record: its configuration, metrics, summary and log, not its checkpoints
  and TensorBoard events;
* the best weights of a finished stage that an unfinished stage still needs (a pretraining whose
  finetuning has not finished), so that the comparison can go on from the copy.

Unfinished stages (pending, started, failed or held) are left out: run from the copy, they start
afresh. Running the same command with ``--out DEST`` continues the comparison: the finished
stages are reused, each checked against the plan's settings (their fingerprints) as always. The copy
is built beside ``DEST`` and moved into place at the end, so an interrupted export leaves ``DEST``
as it was, and a ``DEST`` from an earlier export is replaced whole (the weights that are no longer
needed go with it).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from longrange.errors import ConfigError
from longrange.experiment.plan import Plan
from longrange.fileio import atomic_write
from longrange.train.rundir import RunDir

__all__ = ["ExportReport", "export_results"]


@dataclass
class ExportReport:
    """What an export copied and what it left out."""

    dest: Path
    finished: list[str] = field(default_factory=list)  # stages whose records were copied
    unfinished: list[str] = field(default_factory=list)  # stages left out: they run again from the copy
    weights_kept: list[str] = field(default_factory=list)  # finished stages whose best weights a later stage needs
    files: int = 0
    bytes: int = 0
    left_out_bytes: int = 0  # checkpoints, TensorBoard events and unfinished stages' files

    def lines(self) -> list[str]:
        mb = lambda n: f"{n / 1e6:,.1f} MB"  # noqa: E731
        lines = [
            f"exported to {self.dest}: {len(self.finished)} finished stage(s), {self.files} file(s), "
            f"{mb(self.bytes)} ({mb(self.left_out_bytes)} of checkpoints, events and unfinished stages left out)"
        ]
        if self.weights_kept:
            lines.append(
                f"kept the best weights of {len(self.weights_kept)} finished stage(s) that unfinished stages start "
                f"from: {', '.join(self.weights_kept[:4])}{' ...' if len(self.weights_kept) > 4 else ''}"
            )
        if self.unfinished:
            lines.append(
                f"{len(self.unfinished)} unfinished stage(s) left out (they run again, from the start, in a "
                f"comparison continued from the copy): {', '.join(self.unfinished[:4])}"
                f"{' ...' if len(self.unfinished) > 4 else ''}"
            )
        return lines


def export_results(out_dir: str | Path, dest: str | Path) -> ExportReport:
    """Copy the results of the comparison in ``out_dir`` to ``dest`` (the module doc says which);
    returns what was copied. Errors: ``out_dir`` holds no comparison, or one folder is inside the other."""
    out_dir, dest = Path(out_dir).resolve(), Path(dest).resolve()
    plan = Plan.load(out_dir)  # a ConfigError naming the folder when it holds no comparison
    if dest == out_dir or out_dir in dest.parents or dest in out_dir.parents:
        raise ConfigError(
            f"--export: {dest} and {out_dir} are the same folder or one holds the other; give another DEST"
        )
    if dest.exists() and not dest.is_dir():
        raise ConfigError(f"--export: {dest} exists and is not a folder")

    stages = {s.id: s for s in plan.stages}
    finished = {sid for sid in stages if RunDir(out_dir / sid).finished()}
    # a finished stage's weights are needed while a stage that starts from it or waits on it is unfinished
    needed = {
        dep for sid, s in stages.items() if sid not in finished for dep in [*s.after, s.init_from] if dep in finished
    }
    report = ExportReport(dest)
    report.finished = sorted(finished)
    report.unfinished = sorted(set(stages) - finished)
    report.weights_kept = sorted(needed)

    stage_roots = {(out_dir / sid).resolve(): sid for sid in stages}
    tmp = dest.parent / f".{dest.name}.export-tmp"
    if tmp.exists():
        shutil.rmtree(tmp)  # an earlier export that was interrupted
    try:
        for path in sorted(out_dir.rglob("*")):
            if not path.is_file() or path.name.startswith("."):  # locks and half-written temporary files
                continue
            size = path.stat().st_size
            if _keep(path, out_dir, stage_roots, finished, needed):
                atomic_write(tmp / path.relative_to(out_dir), path.read_bytes())
                report.files += 1
                report.bytes += size
            else:
                report.left_out_bytes += size
        tmp.mkdir(parents=True, exist_ok=True)  # an empty comparison still exports its folder
        old = dest.parent / f".{dest.name}.export-old"
        if dest.exists():
            dest.rename(old)
        tmp.rename(dest)
        if old.exists():
            shutil.rmtree(old)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return report


def _keep(path: Path, out_dir: Path, stage_roots: dict[Path, str], finished: set[str], needed: set[str]) -> bool:
    """Whether ``path`` (a file under ``out_dir``) is part of the export."""
    sid, inside = _stage_of(path, out_dir, stage_roots)
    if sid is None:
        return True  # the plan, a study's settings and reports
    if sid not in finished:
        return False
    run = RunDir(out_dir / sid)
    if inside.parts and inside.parts[0] == run.tensorboard.name:
        return False
    if inside.parts and inside.parts[0] == run.checkpoints.name:
        return sid in needed and path in run.weights("best")
    return True


def _stage_of(path: Path, out_dir: Path, stage_roots: dict[Path, str]) -> tuple[str | None, Path]:
    """The stage whose run directory holds ``path`` (the innermost: a finetuning's folder may sit
    inside its pretraining's seed folder) and the path inside it; (None, path) outside every stage."""
    for parent in path.resolve().parents:
        if parent in stage_roots:
            return stage_roots[parent], path.resolve().relative_to(parent)
        if parent == out_dir:
            break
    return None, path
