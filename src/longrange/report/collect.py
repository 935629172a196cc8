"""Reading run directories: ``summary.json``, ``metrics.jsonl`` and ``config.yaml``.

A finished run directory holds ``summary.json`` (written by the experiment runner at the end of a
stage), ``config.yaml`` and ``metrics.jsonl`` (written by the trainer, see ``train/loop.py`` and
``train/logging.py``) and the best weights. ``summary.json`` is a
:class:`~longrange.train.rundir.summary.RunSummary` (its ``FIELDS`` list every field, its type and
whether a summary must hold it); :func:`read_run` reads it through that type, so a missing or
mistyped field is a :class:`DataFormatError` naming the file and the field, and a summary of a
newer format than this longrange reads is an error saying so.
A run that did not finish is never a result: a run directory whose state (``RunDir.state``, the
one reading of a run directory used everywhere) is not finished -- running, failed (``failed.json``:
a stage that raised, e.g. diverged), unfinished or interrupted -- or whose ``summary.json`` holds a
null or non-finite metric, is collected as a :class:`FailedRun`
with its reason (:func:`collect`) and listed in the report's "Failed or unfinished runs" section,
never in the tables.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longrange.errors import DataFormatError, DataMissingError
from longrange.fileio import is_number
from longrange.train.logging import read_metrics
from longrange.train.rundir import CONFIG_FILE, FAILED_FILE, SUMMARY_FILE, RunDir, RunState
from longrange.train.rundir.summary import STAGES as _ALL_STAGES
from longrange.train.rundir.summary import RunSummary

#: Stages whose runs are compared in the main table; pretraining stages are listed apart.
FINAL_STAGES = ("train", "finetune")
STAGES = _ALL_STAGES  # ("train", "finetune", "pretrain")


@dataclass
class Run:
    """One finished stage of one seed, as read from its run directory."""

    path: Path
    task: str
    label: str
    regime: str
    stage: str
    seed: int
    metric: str
    higher_is_better: bool
    best_val: dict[str, float]
    test: dict[str, float] | None
    steps: int
    params_total: int
    params_in_primitives: int
    seconds: float
    #: Elements of recurrent state per sequence at the task's length (None: not generating, or not recorded).
    state: int | None = None
    pretrain_run: str | None = None
    #: The task's train_subset (a data-fraction sweep's dimension) and the training set size it left.
    train_subset: float | int | None = None
    train_size: int | None = None
    #: The longrange version that made the run (None in summaries that do not say).
    version: str | None = None
    #: Where the run trained and the implementation each op ran (None: not recorded).
    device: dict[str, Any] | None = None
    kernels: dict[str, str] | None = None
    _config: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def is_final(self) -> bool:
        return self.stage in FINAL_STAGES

    @property
    def summary_file(self) -> Path:
        """The ``summary.json`` this run was read from."""
        return RunDir(self.path).summary

    @property
    def key(self) -> tuple[str, str, str]:
        """The table cell this run belongs to: (task, label, regime)."""
        return (self.task, self.label, self.regime)

    def has_test(self) -> bool:
        return self.test is not None and is_number(self.test.get(self.metric))

    def value(self, source: str, metric: str | None = None) -> float:
        """The run's ``metric`` (default: its own metric) from ``source`` "test" or "val" (best
        validation); NaN if logged as null."""
        metric = metric or self.metric
        if source == "test":
            if self.test is None or not is_number(self.test.get(metric)):
                raise DataFormatError(f"no test value of '{metric}'", self.summary_file)
            return float(self.test[metric])
        if source == "val":
            v = self.best_val.get(metric)
            if v is None:
                if metric in self.best_val:
                    return math.nan
                what = " (the run's metric)" if metric == self.metric else ""
                raise DataFormatError(
                    f"best_val has no '{metric}'{what}; it has {sorted(self.best_val)}",
                    RunDir(self.path).summary,
                )
            return float(v)
        raise ValueError(f"source must be 'test' or 'val', got {source!r}")

    @property
    def config(self) -> dict[str, Any]:
        """The run's ``config.yaml`` (read on first use)."""
        if self._config is None:
            config = RunDir(self.path).read_config()
            if config is None:
                raise DataMissingError(
                    f"{RunDir(self.path).config}: no such file (every run directory has its resolved configuration)"
                )
            self._config = config
        return self._config

    def curve(self, split: str = "val", metric: str | None = None) -> list[tuple[int, float]]:
        """(step, value) of ``metric`` (default: the run's metric) on ``split`` from ``metrics.jsonl``.

        Records without the metric, or with it logged as null (non-finite), are left out.
        Raises :class:`DataMissingError` when the file is absent.
        """
        metric = metric or self.metric
        out = []
        for rec in read_metrics(RunDir(self.path).metrics):
            if rec["split"] == split:
                v = rec["metrics"].get(metric)
                if v is not None:
                    out.append((rec["step"], float(v)))
        return out


def read_run(run_dir: str | Path) -> Run:
    """The :class:`Run` described by the run directory's ``summary.json``, its fields checked
    (:meth:`RunSummary.from_json`)."""
    run = RunDir(Path(run_dir))
    run_dir, path = run.root, run.summary
    try:
        d = run.read_summary()
    except OSError as err:
        raise DataMissingError(f"{path}: cannot read ({err.strerror})") from None
    if d is None:
        raise DataMissingError(f"{path}: no such file")
    s = RunSummary.from_json(d, path)
    return Run(
        path=run_dir,
        task=s.task,
        label=s.label,
        regime=s.regime,
        stage=s.stage,
        seed=s.seed,
        metric=s.metric,
        higher_is_better=s.higher_is_better,
        best_val=dict(s.best_val),
        test=dict(s.test) if s.test is not None else None,
        steps=s.steps,
        params_total=s.params.total,
        params_in_primitives=s.params.in_primitives,
        seconds=s.seconds,
        state=s.params.state,
        pretrain_run=s.pretrain_run,
        train_subset=s.train_subset,
        train_size=s.train_size,
        version=s.version,
        device=s.device,
        kernels=s.kernels,
    )


def find_run_dirs(paths: Iterable[str | Path]) -> tuple[list[Path], list[Path]]:
    """(finished, unfinished) run directories under ``paths``, each sorted and without repeats.

    A path is a run directory itself or a tree searched recursively. A directory that holds
    ``summary.json``, ``config.yaml`` or ``failed.json`` is a run directory; it is finished when its
    state (:meth:`RunDir.state`, the one reading used everywhere) says so.
    """
    # Keyed by resolved path (no repeats when paths overlap), shown as the user spelled them.
    found: dict[Path, Path] = {}
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise DataMissingError(f"{p}: no such run directory or file")
        if p.is_file():
            if p.name not in (SUMMARY_FILE, CONFIG_FILE):
                raise DataFormatError(f"expected a run directory, or its {SUMMARY_FILE}", p)
            p = p.parent
        for marker in (SUMMARY_FILE, CONFIG_FILE, FAILED_FILE):
            for c in p.rglob(marker):  # rglob includes p itself
                if c.is_file():
                    found[c.parent.resolve()] = c.parent
    finished, unfinished = [], []
    for d in found.values():
        (finished if RunDir(d).state().kind is RunState.FINISHED else unfinished).append(d)
    return sorted(finished), sorted(unfinished)


def _warn_stderr(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def collect_runs(paths: Iterable[str | Path], warn: Callable[[str], None] | None = None) -> list[Run]:
    """Every finished run under ``paths`` (run directories or trees searched recursively) that
    holds a result.

    Failed or unfinished runs (see :func:`collect`) are passed to ``warn`` (default: a
    ``warning:`` line on stderr) in one message listing them with their reasons. Malformed files
    raise :class:`DataFormatError` naming the file. Raises :class:`DataMissingError` if no run
    with a result is found.
    """
    found = collect(paths)
    if found.failed:
        (warn or _warn_stderr)(
            f"{len(found.failed)} failed or unfinished run(s), not reported as results: "
            + "; ".join(f"{f.path} ({f.reason})" for f in found.failed)
        )
    return found.runs


# ------------------------------------------------------------------------------------------------
# failed and unfinished runs: listed with their reason, never in the tables
# ------------------------------------------------------------------------------------------------
@dataclass
class FailedRun:
    """A run directory that holds no result, and why."""

    path: Path
    reason: str


@dataclass
class Collection:
    """The runs with a result, and the runs that failed or did not finish."""

    runs: list[Run]
    failed: list[FailedRun]


def _short(text: str, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def failure_reason(run_dir: Path) -> str:
    """Why a run directory that did not finish (:meth:`RunDir.state`) holds no result."""
    run = RunDir(run_dir)
    state = run.state()
    damaged = f"; unreadable: {_short('; '.join(state.damaged))}" if state.damaged else ""
    if state.kind is RunState.HELD:
        holder = state.holder or {}
        return f"running: held by PID {holder.get('pid')} on host {holder.get('host')}{damaged}"
    if state.failure is not None:
        error = state.failure.get("error")
        return (f"failed: {_short(error)}" if error else f"failed (unreadable {FAILED_FILE})") + damaged
    try:
        records = read_metrics(run.metrics)
    except (DataMissingError, DataFormatError):
        records = []
    if records:
        last = records[-1]
        null = sorted(k for k, v in last["metrics"].items() if v is None or not math.isfinite(v))
        if null:
            return f"diverged: {last['split']} {', '.join(null)} non-finite at step {last['step']} (no {SUMMARY_FILE})"
        return f"unfinished or interrupted: no {SUMMARY_FILE}, last logged step {last['step']}{damaged}"
    return f"unfinished: no {SUMMARY_FILE} and nothing logged{damaged}"


def result_problem(run: Run) -> str | None:
    """Why a finished run's summary is not a result (a null or non-finite metric), or None."""
    bad = []
    v = run.best_val.get(run.metric)
    if v is None or not math.isfinite(v):
        bad.append(f"best_val.{run.metric} is {v}")
    if run.test is not None and run.metric in run.test:
        t = run.test[run.metric]
        if t is None or not math.isfinite(t):
            bad.append(f"test.{run.metric} is {t}")
    return f"non-finite result: {'; '.join(bad)}" if bad else None


def collect(paths: Iterable[str | Path]) -> Collection:
    """The runs under ``paths`` with a result, and those without one, each with its reason:
    ``failed.json`` (the stage raised, e.g. diverged), no ``summary.json`` (unfinished,
    interrupted or diverged), or a summary whose metric is null or non-finite.

    Malformed files raise :class:`DataFormatError` naming the file. Raises
    :class:`DataMissingError` when no run under ``paths`` holds a result (naming the failed ones).
    """
    paths = list(paths)
    finished, unfinished = find_run_dirs(paths)
    runs: list[Run] = []
    failed = [FailedRun(d, failure_reason(d)) for d in unfinished]
    for d in finished:
        run = read_run(d)
        problem = result_problem(run)
        if problem is None:
            runs.append(run)
        else:
            failed.append(FailedRun(d, problem))
    failed.sort(key=lambda f: str(f.path))
    if not runs:
        where = ", ".join(str(p) for p in paths)
        listing = "".join(f"; {f.path}: {f.reason}" for f in failed[:5]) + ("; ..." if len(failed) > 5 else "")
        raise DataMissingError(f"no finished runs with a result ({SUMMARY_FILE}) under {where}{listing}")
    return Collection(runs, failed)


def failed_section(failed: Sequence[FailedRun]) -> str:
    """Markdown section listing the failed or unfinished runs with their reasons ('' if none)."""
    if not failed:
        return ""
    lines = [
        "## Failed or unfinished runs",
        "",
        f"{len(failed)} run(s) without a result; none of them is in the tables above.",
        "",
        "| Run | Reason |",
        "|---|---|",
    ]

    def cell(text: object) -> str:
        return str(text).replace("|", "\\|")

    for f in failed:
        lines.append(f"| {cell(f.path)} | {cell(f.reason)} |")
    return "\n".join(lines) + "\n"
