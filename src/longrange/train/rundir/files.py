"""Reading and writing a run directory's records: ``config.yaml``, ``summary.json``, ``failed.json``,
``stage.log``, and clearing what a run wrote before it starts afresh.

Every write is atomic (:mod:`longrange.fileio`): a kill leaves the old file or the new one.
``config.yaml`` is sealed (:func:`longrange.fileio.seal`), so that a file cut short reads as an error
naming it, never as a smaller configuration; ``summary.json`` is the run's commit point, written
last. A reader returns None for a file that is not there and raises a :class:`DataFormatError`
naming the file (and the line) for one that cannot be read.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from longrange.errors import ConfigError, DataFormatError, DataMissingError, DiskWriteError
from longrange.faults import kill_point
from longrange.fileio import SEAL_PREFIX, append_text, atomic_write, seal, unseal, write_json
from longrange.identity import fingerprint
from longrange.train.rundir.layout import CONFIG_FILE, RunLayout
from longrange.train.rundir.lock import pid_alive

#: PyYAML's safe loader, its C implementation where PyYAML has one (tens of times faster: a grid's
#: coordinator reads every stage's config.yaml, a 10,000-stage grid tens of thousands of them).
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def plain(value: Any, where: str = "config") -> Any:
    """``value`` as YAML-safe plain data (tuples become lists, paths strings); a ConfigError naming
    the field for anything else."""
    if isinstance(value, Mapping):
        return {str(k): plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, str):
        return str(value)  # also str subclasses (e.g. torch's version string), which YAML cannot write
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise ConfigError(f"config value {where} of type {type(value).__name__} cannot be saved to YAML")


# ----------------------------------------------------------------------------- reading
def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when there is no such file."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataFormatError(f"not valid JSON: {err.msg} (column {err.colno})", path, err.lineno) from None
    if not isinstance(data, dict):
        raise DataFormatError(f"expected a JSON object, got {type(data).__name__}", path)
    return data


def try_json(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the JSON object in ``path`` or None, why it cannot be read or None)."""
    try:
        return read_json(path), None
    except DataFormatError as err:
        return None, str(err)
    except OSError as err:
        return None, f"{path}: cannot read ({err.strerror})"


def read_config(run: RunLayout, required: bool = False) -> dict[str, Any] | None:
    """``config.yaml`` as a dict; None when it is missing (an error naming it with ``required``).
    A file cut short or altered (its seal does not match, see :func:`longrange.fileio.seal`) or
    invalid YAML is a :class:`DataFormatError` naming the file (and the line)."""
    path = run.config
    if not path.is_file():
        if required:
            raise DataMissingError(f"{run.root} is not a run directory (no {CONFIG_FILE})")
        return None
    try:
        raw = path.read_bytes()
        data = yaml.load(unseal(raw, path), Loader=YAML_LOADER)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        seal_line = 1 if raw.startswith(SEAL_PREFIX) else 0  # lines are counted in the file, seal included
        raise DataFormatError(
            f"not valid YAML: {getattr(err, 'problem', err)}",
            path,
            mark.line + 1 + seal_line if mark is not None else None,
        ) from None
    if not isinstance(data, dict):
        raise DataFormatError(f"expected a mapping at the top level, got {type(data).__name__}", path)
    return data


def read_summary(run: RunLayout) -> dict[str, Any] | None:
    """``summary.json`` as a dict, or None when the run has not finished."""
    return read_json(run.summary)


def read_failure(run: RunLayout) -> dict[str, Any] | None:
    """``failed.json`` as a dict, or None (an unreadable record reads as ``{}``)."""
    try:
        return read_json(run.failure)
    except DataFormatError:
        return {}


def failure_since(run: RunLayout, since: float) -> str | None:
    """The error of a failure recorded at ``since`` or later, else None."""
    record = read_failure(run)
    if record and record.get("time", 0) >= since - 1:
        return str(record.get("error"))
    return None


def summary_version(summary: Mapping[str, Any]) -> str | None:
    """The longrange version a ``summary.json`` says made the run (``versions.longrange``), or None."""
    versions = summary.get("versions")
    version = versions.get("longrange") if isinstance(versions, Mapping) else None
    return str(version) if version is not None else None


# ----------------------------------------------------------------------------- writing
def write_config(run: RunLayout, config: Mapping[str, Any]) -> dict[str, Any]:
    """Write ``config`` (plain data, see :func:`plain`) with its fingerprint; returns what was written."""
    out = plain({k: v for k, v in config.items() if k != "fingerprint"})
    out["fingerprint"] = fingerprint(out)
    atomic_write(run.config, seal(yaml.safe_dump(out, sort_keys=False)))
    return out


def write_summary(run: RunLayout, summary: Mapping[str, Any]) -> None:
    write_json(run.summary, dict(summary))


def record_failure(run: RunLayout, error: str, *, stage: str | None = None, trace: str | None = None) -> None:
    """Write ``failed.json``: the error, its traceback and where the log is."""
    record = {
        "stage": stage,
        "error": error,
        "traceback": trace,
        "log": str(run.log) if run.log.is_file() else None,
        "time": time.time(),
    }
    try:
        write_json(run.failure, record, indent=1)
    except DiskWriteError as err:  # the failure itself is raised by the caller; say why it is not on record
        print(f"warning: the failure of {run.root} is not recorded: {err}", file=sys.stderr, flush=True)


def record_exception(run: RunLayout, err: BaseException, stage: str | None = None) -> None:
    record_failure(run, f"{type(err).__name__}: {err}", stage=stage, trace=traceback.format_exc())


def clear_failure(run: RunLayout) -> None:
    run.failure.unlink(missing_ok=True)


def start_log(run: RunLayout, line: str) -> Path:
    """Append a header line to ``stage.log`` (created) and return its path."""
    run.root.mkdir(parents=True, exist_ok=True)
    append_text(run.log, f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")
    return run.log


def remove_leftovers(run: RunLayout) -> list[Path]:
    """Remove the temporary files of atomic writes whose writer died before renaming them
    (``.NAME.tmp-PID``, PID gone on this host); returns them. Called by the lock's holder."""
    removed = []
    for folder in (run.root, run.checkpoints):
        for tmp in folder.glob(".*.tmp-*"):
            pid = tmp.name.rpartition(".tmp-")[2]
            if pid.isdigit() and not pid_alive(int(pid)):
                tmp.unlink(missing_ok=True)
                removed.append(tmp)
    return removed


def clear(run: RunLayout) -> None:
    """Remove what a run wrote (checkpoints, metrics, summary, TensorBoard events) before a fresh start."""
    # The summary first: once it is gone, a kill anywhere below leaves a run that is not finished.
    for f in (run.summary, run.last, *reversed(run.weights("best")), run.metrics):  # best.pt, best.safetensors
        f.unlink(missing_ok=True)
        if f == run.summary:
            kill_point("after-clear-summary")
    if run.tensorboard.is_dir():
        for f in run.tensorboard.glob("events.out.tfevents.*"):
            f.unlink()
    run.checkpoints.mkdir(parents=True, exist_ok=True)
