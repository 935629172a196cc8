"""Generated data: a task whose data a generator makes (ListOps, Pathfinder) registers it::

    register_generator("listops", build, defaults, {"short": {...}, "lra": {}})

and then loads *generated* data, built on first use from a named configuration or from options
(``load_task(..., generate="short")``, ``task.generate`` in an experiment).

Generated data lives under ``<data_dir>/generated/<task>/<config>-<hash>/``, one directory per
configuration (the hash covers every generator option and the generator's version), so two
configurations never share files or prepared-data caches; a directory appears only once complete
(built aside, then renamed), so concurrent first uses never read half a data set.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longrange import smoke
from longrange.data.locations import default_data_dir
from longrange.data.registry import resolved_options
from longrange.errors import ConfigError, DataFormatError
from longrange.registry import Registry, unknown_option

#: The sub-directory of the data directory that holds generated data, one directory per configuration.
GENERATED_DIR = "generated"
#: The file, inside a generated configuration's directory, that records how it was made.
GENERATED_MANIFEST = "generated.json"


@dataclass(frozen=True)
class Generator:
    """How a task's data is generated (see :func:`register_generator`)."""

    build: Callable[..., Any]
    defaults: dict[str, Any]
    configurations: dict[str, dict[str, Any]]
    version: int = 1
    from_task: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    def options(self, config: str, values: Mapping[str, Any], task: str) -> dict[str, Any]:
        """The configuration ``config`` with ``values`` over it, checked against the defaults."""
        if config not in self.configurations:
            known = ", ".join(sorted(self.configurations)) or "(none)"
            raise ConfigError(f"task {task}: unknown generated configuration {config!r}; known: {known}")
        unknown = sorted(set(values) - set(self.defaults))
        if unknown:
            raise unknown_option(unknown[0], f"the {task} generator (task.generate)", list(self.defaults))
        return {**self.defaults, **self.configurations[config], **values}


#: The generators of the tasks that have one, by task name.
GENERATORS: Registry = Registry("data generator")


def register_generator(
    task: str,
    build: Callable[..., Any],
    defaults: Mapping[str, Any],
    configurations: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    version: int = 1,
    from_task: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> None:
    """Let ``task``'s data be generated on first use (``task.generate`` in an experiment).

    Args:
        task: the registered task whose files the generator writes.
        build: ``build(root: Path, quiet: bool, **options)`` writes the task's files under ``root``
            exactly as the task's loader reads them from a data directory.
        defaults: every generator option with its default.
        configurations: named configurations (option values over ``defaults``), e.g. ``{"short":
            {...}}``; ``default`` (the defaults themselves) is always one.
        version: bump it when the files made for the same options change; older builds are then
            not reused.
        from_task: ``from_task(task_options) -> options`` that the task's own options fix (e.g. an
            image resolution); giving them other values in ``task.generate`` is an error.
    """
    configs = {"default": {}, **{str(k): dict(v) for k, v in (configurations or {}).items()}}
    for config, values in configs.items():
        unknown = sorted(set(values) - set(defaults))
        if unknown:
            raise ConfigError(f"generated configuration {config!r} of {task} sets unknown option(s) {unknown}")
    GENERATORS.register(task, Generator(build, dict(defaults), configs, int(version), from_task), replace=True)


def generator(task: str) -> Generator | None:
    """The task's generator, or None if its data cannot be generated."""
    return GENERATORS.get(task) if task in GENERATORS else None


def generated_configuration(
    task: str, generate: str | Mapping[str, Any], task_options: Mapping[str, Any]
) -> tuple[str, str, dict]:
    """(configuration name, hash of the options, resolved generator options) of ``generate``."""
    gen = generator(task)
    if gen is None:
        able = ", ".join(GENERATORS.names()) or "none"
        raise ConfigError(
            f"task.generate: the data of task {task} cannot be generated (tasks with a generator: "
            f"{able}); remove task.generate to read its files"
        )
    if isinstance(generate, str):
        config, values = generate, {}
    elif isinstance(generate, Mapping):
        values = dict(generate)
        config = str(values.pop("config", "default"))
    else:
        raise ConfigError(
            f"task.generate must be a configuration name or a mapping of generator options, got {generate!r}"
        )
    options = gen.options(config, values, task)
    if gen.from_task is not None:
        for key, value in gen.from_task(dict(task_options)).items():
            if key in values and values[key] != value:
                raise ConfigError(
                    f"task.generate.{key}={values[key]!r} contradicts the task's options, which need "
                    f"{key}={value!r}; set the task option instead"
                )
            options[key] = value
    options = smoke.generated_sizes(options)  # LONGRANGE_SMOKE=1: small, in a directory of its own
    text = json.dumps({"task": task, "version": gen.version, "options": options}, sort_keys=True, default=str)
    return config, hashlib.sha256(text.encode()).hexdigest()[:10], options


def generated_root(
    task: str,
    data_dir: str | os.PathLike | None,
    generate: str | Mapping[str, Any],
    task_options: Mapping[str, Any] | None = None,
) -> Path:
    """The data directory of a generated configuration (it may not exist yet)."""
    opts = resolved_options(task, dict(task_options or {}))
    config, key, _ = generated_configuration(task, generate, opts)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in config)
    return default_data_dir(data_dir) / GENERATED_DIR / task / f"{safe}-{key}"


def ensure_generated(
    task: str,
    data_dir: str | os.PathLike | None,
    generate: str | Mapping[str, Any],
    task_options: Mapping[str, Any] | None = None,
    *,
    quiet: bool = False,
) -> Path:
    """The data directory of a generated configuration, built first if it is not there.

    It is built in a directory beside it and renamed into place when complete, with a
    ``generated.json`` that records the options; when another process finished first, its build is
    kept and this one discarded. One line on stderr says what is generated and where, another how
    long it took (``quiet``: none)."""
    opts = resolved_options(task, dict(task_options or {}))
    root = generated_root(task, data_dir, generate, opts)
    config, key, options = generated_configuration(task, generate, opts)
    manifest_path = root / GENERATED_MANIFEST
    if manifest_path.is_file():
        try:
            made = json.loads(manifest_path.read_text()).get("options")
        except (OSError, ValueError, AttributeError):
            made = None
        if made != json.loads(json.dumps(options, default=str)):
            raise DataFormatError(
                f"the generated data in {root} was made with other options than {options}; "
                "delete that directory to generate it again",
                manifest_path,
            )
        return root
    gen = generator(task)
    shown = ", ".join(f"{k}={v}" for k, v in options.items())
    if not quiet:
        print(
            f"generating {task} data {config!r} ({shown}) into {root} on first use; later runs reuse it",
            file=sys.stderr,
            flush=True,
        )
    start = time.time()
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = root.with_name(f".{root.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        gen.build(tmp, quiet=quiet, **options)
        manifest = {"task": task, "config": config, "version": gen.version, "options": options}
        (tmp / GENERATED_MANIFEST).write_text(json.dumps(manifest, indent=1, default=str) + "\n")
        try:
            os.rename(tmp, root)
        except OSError:
            if not (root / GENERATED_MANIFEST).is_file():  # not a build of another process: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not quiet:
        print(f"generated {task} data {config!r} in {time.time() - start:.1f}s", file=sys.stderr, flush=True)
    return root
