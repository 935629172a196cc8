"""Experiment configuration: presets (YAML files), user config files, and dotted overrides.

An experiment is one model on one task with its training settings, plus how self-pretraining
(SPT) and finetuning differ from them::

    label: Transformer                    # the row name in reports
    task: {name: listops, options: {seq_len: 2048}}   # + generate: short  (generated data, built on first use)
    model: {block: transformer, primitive: attention, ...}      # ModelConfig fields
    train: {lr: 0.0001, batch_size: 32, epochs: 40, ...}        # TrainConfig fields (scratch and finetuning)
    pretrain: {epochs: 40}                # TrainConfig overrides for the pretraining stage
    finetune: {}                          # TrainConfig overrides for the finetuning stage
    pretrain_model: {dropout: 0.0}        # ModelConfig overrides for the pretraining stage
    pretrain_task: {options: {pool: pretrain}}   # TaskConfig overrides for the pretraining stage
    objective: {mask_ratio: 0.1, ...}     # pretraining objective options (ObjectiveConfig)
    compare: {objectives: [causal, masked], seeds: [0, 1, 2], compute_matched: true,
              train_subsets: [0.05, 0.1, 1.0],     # a data-fraction sweep (optional)
              launcher: {kind: local, jobs: 2}}   # how the grid runs (LauncherConfig)

Any field can be overridden from the command line by its dotted name: ``model.d_model=128``,
``train.lr=3e-4``, ``task.options.seq_len=1024``. Values are read as YAML (numbers, booleans,
lists like ``[0,1,2]``).
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from longrange import typed
from longrange.errors import ConfigError
from longrange.identity import declare_defaults
from longrange.models.config import ModelConfig
from longrange.objectives.factory import KINDS, SPT_KINDS, ObjectiveConfig
from longrange.train.config import TrainConfig

#: The objectives of a stage, and those of self-pretraining.
OBJECTIVES, SPT_OBJECTIVES = KINDS, SPT_KINDS


@dataclass
class TaskConfig:
    """The data set: a registered task, its options, and which part of its data a run reads."""

    #: The task.
    name: str = "listops"
    #: Task options (e.g. seq_len), see ``longrange data info TASK``.
    options: dict[str, Any] = field(default_factory=dict)
    #: Data directory; None = $LONGRANGE_DATA or ./data.
    data_dir: str | None = None
    #: Train on a subset: a fraction in (0, 1] or a number of examples (data-scarcity experiments).
    train_subset: float | int | None = None
    #: Skip malformed records (and report how many) instead of stopping at the first.
    skip_bad: bool = False
    #: Seed of the data's held-out splits and train subset (fixed across training seeds).
    seed: int = 0
    #: Generated data, built on first use under ``<data_dir>/generated/``: a named configuration of the
    #: task's generator (``short``) or a mapping of its options (``{config: short, n_train: 2000}``);
    #: None = the task's files. ``longrange data info TASK`` lists the configurations. While it is set,
    #: the task's own files are not read (a note says so where they are in the data directory): to
    #: train a generated-data preset (the demo's) on files, add ``task.generate=null``, and
    #: ``task.train_subset=null`` where the preset keeps a subset.
    generate: str | dict[str, Any] | None = None


#: Fields at their default are left out of a run's identity (a new field changes no fingerprint).
declare_defaults("task", lambda: {k: v for k, v in dataclasses.asdict(TaskConfig()).items() if k != "name"})
declare_defaults("objective", lambda: {"reverse": False, **dataclasses.asdict(ObjectiveConfig())})

LAUNCHERS = ("local", "slurm")


@dataclass
class LauncherConfig:
    """How ``compare`` runs the stages of its grid (``compare.launcher``; command-line options override it).

    ``kind: local`` with ``jobs: 1`` runs the stages one after another in the ``compare`` process
    (the default); ``jobs: N`` runs up to N at once as worker processes on this machine. ``kind: slurm``
    submits one SLURM job per stage (or one job array per dependency level) through submitit.
    See docs/cluster.md.
    """

    #: Where the stages run: ``local`` (this machine) or ``slurm`` (a SLURM cluster, through submitit).
    kind: str = "local"
    #: local: stages at once (worker processes); 1 = in this process, one after another; ``auto``: one
    #: per GPU, else one per core with one thread each (the measured best for small models).
    jobs: int | Literal["auto"] = 1
    #: torch/OMP/MKL threads per stage; 0 = the machine's cores // jobs (local), the job's CPUs (slurm).
    threads_per_job: int = 0
    #: slurm: the partition (None: the cluster's default).
    partition: str | None = None
    #: slurm: the time limit of each job, in minutes.
    time_min: int = 240
    #: slurm: GPUs per job; more than 1 runs the stage data-parallel (torchrun) inside its job. 0: CPU only.
    gpus_per_job: int = 1
    #: slurm: CPUs per job (0: the cluster's default).
    cpus_per_job: int = 0
    #: slurm: memory per job in GB (None: the cluster's default).
    mem_gb: float | None = None
    #: slurm: the account to charge (None: the cluster's default).
    account: str | None = None
    #: slurm: the quality of service (None: the cluster's default).
    qos: str | None = None
    #: slurm: one job array per dependency level instead of one job per stage.
    array: bool = False
    #: slurm: more sbatch options by their long name, e.g. {constraint: a100, exclude: node7}.
    extra: dict[str, Any] = field(default_factory=dict)
    #: slurm: wait for the jobs and write the report (false: return once submitted).
    wait: bool = True

    def __post_init__(self) -> None:
        if self.kind not in LAUNCHERS:
            raise ConfigError(f"compare.launcher.kind must be one of {', '.join(LAUNCHERS)}, got {self.kind!r}")
        for name in ("jobs", "time_min"):
            if getattr(self, name) != "auto" and getattr(self, name) < 1:
                raise ConfigError(f"compare.launcher.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("threads_per_job", "gpus_per_job", "cpus_per_job"):
            if getattr(self, name) < 0:
                raise ConfigError(f"compare.launcher.{name} must be >= 0, got {getattr(self, name)}")
        if self.mem_gb is not None and self.mem_gb <= 0:
            raise ConfigError(f"compare.launcher.mem_gb must be positive, got {self.mem_gb}")


#: What self-pretraining reads (``compare.pretrain_data``).
PRETRAIN_DATA = ("subset", "all")


@dataclass
class CompareConfig:
    """The grid of ``longrange compare``: training from scratch against self-pretraining (SPT) then
    finetuning, for every seed (and training subset of a sweep)."""

    #: SPT objectives to compare against training from scratch; [] = the model's natural one
    #: (causal for causal models, masked for bidirectional ones, as in the SPT paper).
    objectives: list[str] = field(default_factory=list)
    #: The seeds: every regime runs once per seed (``train.seed`` of its stages; ``--seeds`` overrides).
    seeds: list[int] = field(default_factory=lambda: [0])
    #: Also train from scratch for as many steps as pretraining plus finetuning.
    compute_matched: bool = True
    #: A data-fraction sweep: each entry (a fraction in (0, 1] or a count >= 1) is a dimension of
    #: the grid and the ``task.train_subset`` of every stage under it, pretraining included.
    #: [] = no sweep (the task's own ``train_subset``).
    train_subsets: list[float | int] = field(default_factory=list)
    #: What self-pretraining reads: ``subset`` (the labelled training examples the stages under it
    #: train on, the SPT paper's setting) or ``all`` (the inputs of the whole training split, labels
    #: unused: labels scarce, inputs plentiful; one pretraining run per seed and objective, shared
    #: by every subset of a sweep; its regime is ``<objective>-spt-all``).
    pretrain_data: str = "subset"
    #: How the grid's stages are run (in process, local workers, SLURM); not part of any stage's settings.
    launcher: LauncherConfig = field(default_factory=LauncherConfig)


@dataclass
class ExperimentConfig:
    #: The experiment's name in reports and run directories; empty = the model's name (``mamba-s6``).
    label: str = ""
    #: What the experiment is, and what it approximates (presets name everything not published).
    description: str = ""
    #: Where its settings come from (a preset's paper, table, files and lines).
    source: str = ""
    #: The data set.
    task: TaskConfig = field(default_factory=TaskConfig)
    #: The model.
    model: ModelConfig = field(default_factory=ModelConfig)
    #: The training settings (TrainConfig fields) of training from scratch and finetuning, and the
    #: base of pretraining's.
    train: dict[str, Any] = field(default_factory=dict)
    #: TrainConfig fields that differ in the pretraining stage (on top of ``train``).
    pretrain: dict[str, Any] = field(default_factory=dict)
    #: TrainConfig fields that differ in the finetuning stage (on top of ``train``).
    finetune: dict[str, Any] = field(default_factory=dict)
    #: ModelConfig fields that differ during pretraining (e.g. dropout 0); the backbone's shape must not.
    pretrain_model: dict[str, Any] = field(default_factory=dict)
    #: TaskConfig fields that differ during pretraining (e.g. a separate pretraining pool of data).
    pretrain_task: dict[str, Any] = field(default_factory=dict)
    #: Options of the pretraining objectives.
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    #: What ``longrange compare`` runs.
    compare: CompareConfig = field(default_factory=CompareConfig)

    def stage_model(self, stage: str) -> ModelConfig:
        if stage == "pretrain" and self.pretrain_model:
            return self.model.replace("pretrain_model", **self.pretrain_model)
        return self.model

    def stage_task(self, stage: str) -> TaskConfig:
        if stage != "pretrain" or not self.pretrain_task:
            return self.task
        merged = deep_merge(dataclasses.asdict(self.task), self.pretrain_task)
        return typed.from_dict(TaskConfig, merged, "pretrain_task")

    def train_config(self, stage: str, **changes: Any) -> TrainConfig:
        """The TrainConfig of a stage: ``train`` updated by the stage's overrides and ``changes``.

        The ``train`` section is checked alone first, so an error in the merged settings names the
        stage's own section (``pretrain.lr``, ``finetune.epochs``)."""
        base = TrainConfig.from_dict(self.train, "train")
        section = {"pretrain": self.pretrain, "finetune": self.finetune}.get(stage)
        if not section and not changes:
            return base
        merged = {**self.train, **(section or {})}
        if section:
            TrainConfig.from_dict(merged, stage)
        return TrainConfig.from_dict({**merged, **changes}, stage if section else "train")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["model"] = self.model.to_dict()
        return out

    def validate(self) -> None:
        for stage in ("train", "pretrain", "finetune"):
            self.train_config(stage)
        self.stage_model("pretrain")
        self.stage_task("pretrain")
        unknown = [o for o in self.compare.objectives if o not in SPT_OBJECTIVES]
        if unknown:
            raise ConfigError(
                f"compare.objectives {unknown} are not SPT objectives; expected {', '.join(SPT_OBJECTIVES)}"
            )
        if not self.compare.seeds:
            raise ConfigError("compare.seeds is empty")
        check_train_subsets(self.compare.train_subsets, "compare.train_subsets")
        if self.compare.pretrain_data not in PRETRAIN_DATA:
            raise ConfigError(
                f"compare.pretrain_data must be one of {', '.join(PRETRAIN_DATA)}, got {self.compare.pretrain_data!r}"
            )


def check_train_subsets(values: Sequence[Any], where: str) -> list[float | int]:
    """The subsets of a data-fraction sweep, checked: fractions (floats) in (0, 1] or counts
    (integers) >= 1, no repeats. ``1.0`` is the whole training set, ``1`` one example."""
    out: list[float | int] = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{where}: {v!r} is not a fraction in (0, 1] or a count of examples")
        if isinstance(v, float) and not 0.0 < v <= 1.0:
            raise ConfigError(f"{where}: the fraction {v} is not in (0, 1] (write a count of examples as an integer)")
        if isinstance(v, int) and v < 1:
            raise ConfigError(f"{where}: the count {v} is not >= 1")
        if any(type(v) is type(o) and v == o for o in out):
            raise ConfigError(f"{where}: {v} is given twice")
        out.append(v)
    return out


_SECTIONS = {"task": TaskConfig, "objective": ObjectiveConfig, "compare": CompareConfig}
_TRAIN_SECTIONS = ("train", "pretrain", "finetune", "pretrain_model", "pretrain_task")


def experiment_from_dict(data: Mapping[str, Any]) -> ExperimentConfig:
    """An :class:`ExperimentConfig` from plain values; every section is converted by its declared
    types and checked (``longrange.typed``), so a bad value is one ConfigError naming the dotted field,
    raised before any data is loaded."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"an experiment must be a mapping of sections, got {data!r}")
    data = dict(data)
    top = {f.name for f in dataclasses.fields(ExperimentConfig)}
    unknown = sorted(str(k) for k in data if k not in top)
    if unknown:
        raise typed.unknown_fields_error(unknown, top, "")
    kwargs: dict[str, Any] = {}
    for name in ("label", "description", "source"):
        if data.get(name) is not None:
            kwargs[name] = str(data[name])
    for name, cls in _SECTIONS.items():
        kwargs[name] = typed.from_dict(cls, data.get(name), name)
    kwargs["model"] = ModelConfig.from_dict(data.get("model"), "model")
    for name in _TRAIN_SECTIONS:
        section = data.get(name) or {}
        if not isinstance(section, Mapping):
            raise ConfigError(f"{name} must be a mapping, got {section!r}")
        kwargs[name] = dict(section)
    exp = ExperimentConfig(**kwargs)
    if not exp.label:
        exp.label = exp.model.name
    exp.validate()
    return exp


# ---------------------------------------------------------------------------------- presets
def _preset_root():
    return resources.files("longrange") / "presets"


def list_presets() -> list[str]:
    """Names of the built-in presets (their paths under presets/, without .yaml)."""
    names: list[str] = []

    def walk(node, prefix: str) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.is_dir():
                walk(child, f"{prefix}{child.name}/")
            elif child.name.endswith(".yaml") and not child.name.startswith("_"):
                names.append(prefix + child.name[: -len(".yaml")])

    walk(_preset_root(), "")
    return names


def _read_yaml(text: str, where: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping at the top level")
    return data


def load_preset(name: str) -> dict[str, Any]:
    """The raw dict of a built-in preset, with its ``base:`` presets merged underneath."""
    path = _preset_root().joinpath(*f"{name}.yaml".split("/"))
    if not path.is_file():
        names = list_presets()
        # The closest spellings first; else the presets that contain the last part of the name.
        close = [n for n in names if name.split("/")[-1] in n]
        hint = typed.did_you_mean(name, names) or (f" (did you mean {' or '.join(close[:5])}?)" if close else "")
        raise ConfigError(f"unknown preset {name!r}{hint}; `longrange presets` lists them")
    data = _read_yaml(path.read_text(), f"preset {name}")
    return _with_bases(data, f"preset {name}")


def _with_bases(data: dict[str, Any], where: str) -> dict[str, Any]:
    bases = data.pop("base", None)
    if bases is None:
        return data
    merged: dict[str, Any] = {}
    for base in [bases] if isinstance(bases, str) else bases:
        merged = deep_merge(merged, load_preset(base))
    return deep_merge(merged, data)


def load_config_file(path: str | Path) -> dict[str, Any]:
    """A YAML experiment file, with its ``base:`` presets merged underneath; a finished run's
    configuration (its run directory's config file) is read as the experiment it ran
    (:func:`experiment_of_run`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    data = _read_yaml(path.read_text(), str(path))
    if is_run_config(data):
        return experiment_of_run(data, str(path))
    return _with_bases(data, str(path))


#: What a run adds to its experiment's sections in its config file: the stage it ran, its data's
#: identity, the pretrained runs it started from, its head, its record and its fingerprint.
RUN_FIELDS = ("regime", "stage", "seed", "data", "init", "head", "record", "fingerprint")


def is_run_config(data: Mapping[str, Any]) -> bool:
    """Whether ``data`` is a run's configuration as its run directory holds it (it has a fingerprint
    and the stage it ran), rather than an experiment."""
    return "fingerprint" in data and "stage" in data


def experiment_of_run(data: Mapping[str, Any], where: str = "the run's configuration") -> dict[str, Any]:
    """The experiment a run ran, from the configuration its run directory holds: its label, task,
    model, objective options and the stage's training settings. The run's own fields (:data:`RUN_FIELDS`;
    the objective's ``kind`` and ``reverse``, and ``train.seed``, the stage's seed) are left out: the
    command that uses the experiment chooses them (``--seed``, ``--objective``, ``--from``), as it does
    for a preset. A run rerun with the same command and seed has the same settings, and so the same
    fingerprint."""
    out = {k: copy.deepcopy(v) for k, v in data.items() if k not in RUN_FIELDS}
    objective = dict(out.get("objective") or {})
    kind, reverse = objective.pop("kind", None), objective.pop("reverse", False)
    out["objective"] = objective
    out["train"] = {k: v for k, v in (out.get("train") or {}).items() if k != "seed"}
    stage = f"{data.get('stage')} stage"
    if kind and kind != "supervised":
        stage += f", objective {kind}" + (" reversed" if reverse else "")
    print(
        f"{where}: a run's configuration ({stage}, seed {data.get('seed')}), read as the experiment it ran: its "
        f"run fields ({', '.join(k for k in RUN_FIELDS if k in data)}) are left out; the command and its --seed "
        "choose the stage",
        file=sys.stderr,
        flush=True,
    )
    return out


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_value(raw: str, where: str) -> Any:
    """A command-line value read as YAML, with numbers like ``3e-4`` read as floats (YAML 1.1 would
    keep them as strings)."""
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: cannot read the value: {err}") from err
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides (values parsed as YAML) to a raw config dict."""
    out = copy.deepcopy(dict(data))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form field.name=value")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(f"override {item!r} has an empty field name")
        value = parse_value(raw, item)
        node = out
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part} is not a section")
            node = child
        node[parts[-1]] = value
    return out


def load_experiment(preset: str) -> dict[str, Any]:
    """The raw dict of a built-in preset, or of a YAML experiment file given in its place (a name
    ending in ``.yaml`` or ``.yml``)."""
    if preset.endswith((".yaml", ".yml")):
        return load_config_file(preset)
    return load_preset(preset)


def resolve(
    preset: str | None = None, config: str | Path | None = None, overrides: Sequence[str] = ()
) -> ExperimentConfig:
    """Preset (a built-in name or a YAML file) and/or config file (the file on top of the preset), then
    the overrides."""
    data: dict[str, Any] = {}
    if preset:
        data = load_experiment(preset)
    if config:
        data = deep_merge(data, load_config_file(config))
    if not preset and not config and not overrides:
        raise ConfigError("give a --preset, a --config file, or field=value settings")
    return experiment_from_dict(apply_overrides(data, overrides))
