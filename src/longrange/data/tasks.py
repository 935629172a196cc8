"""The task registry: what each benchmark is, and how to load it.

A task module registers itself when :mod:`longrange.data` is imported::

    register_task("listops", listops_spec, load_listops, {"seq_len": 2048, "truncate": False},
                  expected=listops_expected_paths)

and users load it by name::

    data = load_task("listops", "data", seed=0, train_subset=0.1)
    loader = DataLoader(data.train, batch_size=32, collate_fn=data.collate)

``data_dir`` is the root data directory (default ``$LONGRANGE_DATA`` or ``./data``); each task
reads its own sub-directory of it (see ``docs/data.md``).

A task whose data a generator makes (ListOps, Pathfinder) also registers the generator::

    register_generator("listops", build, defaults, {"short": {...}, "lra": {}})

and then loads *generated* data, built on first use from a named configuration or from options::

    data = load_task("listops", "data", generate="short", seq_len=128)
    data = load_task("listops", "data", generate={"config": "short", "n_train": 2000}, seq_len=128)

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch import Tensor
from torch.utils.data import Dataset, Subset

from longrange.data.batch import PAD_ID, check_class_labels, check_position_labels, collate
from longrange import smoke
from longrange.data.tokenize import Vocabulary
from longrange.errors import ConfigError, DataFormatError, DataMissingError
from longrange.registry import Registry, unknown_option

#: Environment variable naming the default data directory.
DATA_ENV = "LONGRANGE_DATA"
#: What a generated task records as its data directory (it reads none).
DRAWN_WHEN_LOADED = "(generated)"


@dataclass(frozen=True)
class TaskSpec:
    """Static description of a task (with its options applied)."""

    name: str
    input_kind: str            # "tokens" | "numeric"
    seq_len: int               # maximum sequence length (including any appended <eos>)
    n_classes: int             # 0 for regression
    metric: str                # "accuracy" | "r2"
    mask_ratio: float          # default masking ratio for masked self-pretraining
    d_input: int = 1           # channels of numeric inputs
    n_targets: int = 1         # regression targets
    two_sequences: bool = False
    description: str = ""
    layout: str = ""           # the expected files under the data dir, for `longrange data info`
    obtain: str = ""           # how to obtain or generate the data
    #: Targets are per-position class indices (``IGNORE_INDEX`` where no answer is asked): the
    #: supervised objective is the per-position one, over ``n_classes`` outputs at each answer.
    per_position: bool = False
    #: The answers are predictions of what follows (next-token tasks): supervised models must be causal.
    causal: bool = False
    #: The accuracy of guessing uniformly among the task's possible answers, where it is not
    #: 1 / n_classes (per-position tasks, whose classes are the whole vocabulary); see :func:`chance_level`.
    chance: float | None = None

    def __post_init__(self) -> None:
        if self.input_kind not in ("tokens", "numeric"):
            raise ConfigError(f"task {self.name}: input_kind must be 'tokens' or 'numeric', got {self.input_kind!r}")
        if self.metric not in ("accuracy", "r2"):
            raise ConfigError(f"task {self.name}: metric must be 'accuracy' or 'r2', got {self.metric!r}")
        if self.seq_len < 1:
            raise ConfigError(f"task {self.name}: seq_len must be >= 1, got {self.seq_len}")
        if not 0.0 <= self.mask_ratio < 1.0:
            raise ConfigError(f"task {self.name}: mask_ratio must be in [0, 1), got {self.mask_ratio}")
        if self.per_position and (self.n_classes < 1 or self.metric != "accuracy"):
            raise ConfigError(f"task {self.name}: per-position targets need n_classes >= 1 and metric accuracy")
        if self.chance is not None and not (0.0 < self.chance <= 1.0 and self.metric == "accuracy"):
            raise ConfigError(f"task {self.name}: chance must be an accuracy in (0, 1] of a task scored by accuracy, "
                              f"got {self.chance!r} (metric {self.metric})")


def chance_level(spec: TaskSpec) -> float | None:
    """The accuracy of guessing uniformly among the task's answers: ``spec.chance`` where the task
    states it (the generated recall tasks: 1 / the number of possible answers), else 1 / n_classes
    for a classification scored by accuracy; None for regression, and for a per-position task that
    states none. Uniform guessing, not the majority class: a split's labels are not read here."""
    if spec.chance is not None:
        return spec.chance
    if spec.metric == "accuracy" and spec.n_classes > 0 and not spec.per_position:
        return 1.0 / spec.n_classes
    return None


class SequenceDataset(Dataset):
    """Items ``{"inputs": Tensor, "target": Tensor[, "inputs2": Tensor]}`` (see ``data/batch.py``).

    Args:
        inputs: one tensor per sample, (L,) token ids or (L, C) numeric channels.
        targets: (N,) class indices or (N, T) regression targets.
        inputs2: the second sequence of two-sequence tasks, one tensor per sample.
    """

    def __init__(self, inputs: Sequence[Tensor], targets: Tensor, inputs2: Sequence[Tensor] | None = None):
        if len(inputs) != len(targets):
            raise ValueError(f"{len(inputs)} inputs but {len(targets)} targets")
        if inputs2 is not None and len(inputs2) != len(inputs):
            raise ValueError(f"{len(inputs)} inputs but {len(inputs2)} second inputs")
        self.inputs = list(inputs)
        self.targets = targets
        self.inputs2 = None if inputs2 is None else list(inputs2)

    @classmethod
    def from_packed(cls, flat: Tensor, offsets: Tensor, targets: Tensor,
                    flat2: Tensor | None = None, offsets2: Tensor | None = None) -> "SequenceDataset":
        """Build from :func:`pack`-ed sequences (items are views into ``flat``)."""
        inputs2 = None if flat2 is None else unpack(flat2, offsets2)
        return cls(unpack(flat, offsets), targets, inputs2)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, idx: int) -> dict[str, Tensor]:
        item = {"inputs": _as_long(self.inputs[idx]), "target": self.targets[idx]}
        if self.inputs2 is not None:
            item["inputs2"] = _as_long(self.inputs2[idx])
        return item


_COMPACT_INTS = (torch.uint8, torch.int8, torch.int16, torch.int32)


def _as_long(x: Tensor) -> Tensor:
    """Token ids may be stored compactly (e.g. int16); items always carry LongTensors."""
    return x.long() if x.dtype in _COMPACT_INTS else x


def id_dtype(vocab_size: int) -> torch.dtype:
    """The smallest integer dtype that stores ids below ``vocab_size`` (for compact storage)."""
    return torch.int16 if vocab_size <= 2**15 else torch.int32


def pack(seqs: Sequence[Tensor] | Sequence[Sequence[int]], dtype: torch.dtype = torch.long) -> tuple[Tensor, Tensor]:
    """Concatenate variable-length sequences into (flat, offsets) with offsets of shape (N + 1,).

    One flat tensor saves and loads far faster than many small ones (cache entries).
    """
    tensors = [s.to(dtype) if isinstance(s, Tensor) else torch.as_tensor(s, dtype=dtype) for s in seqs]
    lengths = torch.tensor([t.shape[0] for t in tensors], dtype=torch.long)
    offsets = torch.zeros(len(tensors) + 1, dtype=torch.long)
    torch.cumsum(lengths, 0, out=offsets[1:])
    flat = torch.cat(tensors) if tensors else torch.zeros(0, dtype=dtype)
    return flat, offsets


def unpack(flat: Tensor, offsets: Tensor) -> list[Tensor]:
    """Inverse of :func:`pack`: views into ``flat``."""
    bounds = offsets.tolist()
    return [flat[bounds[i]:bounds[i + 1]] for i in range(len(bounds) - 1)]


def pack_split(out: dict, split: str, seqs: Sequence, labels: Sequence[int], vocab_size: int,
               seqs2: Sequence | None = None) -> None:
    """Store one split of token sequences and class labels in a cache entry ``out``: keys
    ``{split}_flat``, ``{split}_offsets`` (:func:`pack`, ids stored compactly), ``{split}_targets``,
    and ``{split}_flat2``, ``{split}_offsets2`` for the second sequences of two-sequence tasks."""
    out[f"{split}_flat"], out[f"{split}_offsets"] = pack(seqs, dtype=id_dtype(vocab_size))
    if seqs2 is not None:
        out[f"{split}_flat2"], out[f"{split}_offsets2"] = pack(seqs2, dtype=id_dtype(vocab_size))
    out[f"{split}_targets"] = torch.tensor(list(labels), dtype=torch.long)


def unpack_split(prepared: dict, split: str) -> "SequenceDataset":
    """The dataset of one split stored by :func:`pack_split`."""
    return SequenceDataset.from_packed(prepared[f"{split}_flat"], prepared[f"{split}_offsets"],
                                       prepared[f"{split}_targets"], prepared.get(f"{split}_flat2"),
                                       prepared.get(f"{split}_offsets2"))


@dataclass
class TaskData:
    """A loaded task: its spec, the three splits, and the vocabulary of token tasks."""

    spec: TaskSpec
    train: Dataset
    val: Dataset
    test: Dataset
    vocab: Vocabulary | None = None
    #: Bad records skipped with ``skip_bad=True``, per source file.
    skipped: dict[str, int] = field(default_factory=dict)
    #: Free-form facts about the loaded data (e.g. which source, split sizes before subsetting).
    info: dict[str, Any] = field(default_factory=dict)

    def collate(self, items: Sequence[dict]) -> dict[str, Tensor]:
        """Pad items into a batch with the vocabulary's pad id (see ``data/batch.py``); class labels
        outside [0, n_classes) are a DataFormatError (checked here, on the CPU, once per batch)."""
        batch = collate(items, pad_id=self.vocab.pad_id if self.vocab is not None else PAD_ID)
        where = f"a batch of task {self.spec.name}"
        if self.spec.per_position:
            check_position_labels(batch["targets"], self.spec.n_classes, where)
        elif self.spec.n_classes > 0:
            check_class_labels(batch["targets"], self.spec.n_classes, where)
        return batch

    @property
    def vocab_size(self) -> int | None:
        return None if self.vocab is None else len(self.vocab)


@dataclass(frozen=True)
class _Registered:
    spec: Callable[..., TaskSpec]
    loader: Callable[..., TaskData]
    options: dict[str, Any]
    expected: Callable[..., list[Path]] | None
    generated: int | None = None


#: The registered tasks by name (each task module registers its tasks with :func:`register_task`).
TASKS: Registry = Registry("task")


def register_task(name: str, spec: Callable[..., TaskSpec], loader: Callable[..., TaskData], options: dict,
                  expected: Callable[..., list[Path]] | None = None, *, generated: int | None = None) -> None:
    """Add a task to the registry.

    Args:
        name: the task's name (``longrange data list``, ``load_task(name)``).
        spec: ``spec(**options) -> TaskSpec``.
        loader: ``loader(data_dir: Path, spec, seed, skip_bad, **options) -> TaskData``; ``data_dir``
            is the root data directory.
        options: the task's option names with their defaults.
        expected: ``expected(data_dir: Path, **options) -> list[Path]``, the files/directories that
            must exist (for :func:`task_status` and ``longrange data info``).
        generated: for a task whose loader generates its data (no files): the generator's version,
            part of the data's identity (:func:`data_identity`), so runs made by an older generator
            are not taken for runs of this one. Bump it whenever the generated data changes.

    Registering a name again replaces the earlier task.
    """
    if generated is not None and expected is not None:
        raise ConfigError(f"task {name}: a generated task has no expected files")
    TASKS.register(name, _Registered(spec, loader, dict(options), expected, generated), replace=True)


def list_tasks() -> list[str]:
    return TASKS.names()


def _entry(name: str) -> _Registered:
    return TASKS.get(name)


def task_options(name: str) -> dict[str, Any]:
    """The task's options with their defaults."""
    return dict(_entry(name).options)


def _resolve_options(name: str, options: dict) -> dict:
    entry = _entry(name)
    unknown = sorted(set(options) - set(entry.options))
    if unknown:
        raise unknown_option(unknown[0], f"task {name}", list(entry.options))
    return {**entry.options, **options}


def get_spec(name: str, **options) -> TaskSpec:
    """The task's spec with ``options`` applied (unknown task or option -> ConfigError)."""
    return _entry(name).spec(**_resolve_options(name, options))


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


def subset_indices(n: int, subset: float | int, seed: int) -> list[int]:
    """Sorted indices of a deterministic random subset of ``range(n)``.

    ``subset`` is a fraction in (0, 1] (rounded, at least one item) or a count in [1, n]. The subset
    is a prefix of a seeded permutation, so for one seed smaller subsets are contained in larger ones.
    """
    if isinstance(subset, bool) or not isinstance(subset, (int, float)):
        raise ConfigError(f"train_subset must be a fraction in (0, 1] or a count, got {subset!r}")
    if isinstance(subset, float):
        if not 0.0 < subset <= 1.0:
            raise ConfigError(f"train_subset fraction must be in (0, 1], got {subset}")
        count = max(1, round(subset * n))
    else:
        if not 1 <= subset <= n:
            raise ConfigError(f"train_subset count must be in [1, {n}] (the training set size), got {subset}")
        count = subset
    gen = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(n, generator=gen)[:count]
    return sorted(perm.tolist())


def load_task(name: str, data_dir: str | os.PathLike | None = None, *, seed: int = 0,
              train_subset: float | int | None = None, skip_bad: bool = False,
              generate: str | Mapping[str, Any] | None = None, **options) -> TaskData:
    """Load a registered task.

    Args:
        name: task name (unknown -> ConfigError listing the tasks).
        data_dir: root data directory (default ``$LONGRANGE_DATA`` or ``./data``).
        seed: seeds every random choice of the loader (held-out splits) and of ``train_subset``.
        train_subset: keep only a fraction in (0, 1] or a count of the training set (data-scarcity
            experiments); deterministic for the seed.
        skip_bad: skip malformed records (counted in ``TaskData.skipped``) instead of raising.
        generate: read generated data instead of the task's files: a named configuration of the
            task's generator, or a mapping of generator options (``config``: the named configuration
            they start from); built on first use (:func:`ensure_generated`).
        options: task options (see ``longrange data list`` / :func:`task_options`).
    """
    entry = _entry(name)
    opts = _resolve_options(name, options)
    spec = entry.spec(**opts)
    root = default_data_dir(data_dir) if generate is None else ensure_generated(name, data_dir, generate, opts)
    data = entry.loader(root, spec, seed=seed, skip_bad=skip_bad, **opts)
    if generate is not None:
        data.info["generated"] = str(root)
    if data.skipped:
        for path, count in sorted(data.skipped.items()):
            if count:
                print(f"{name}: skipped {count} bad record(s) in {path}", file=sys.stderr, flush=True)
    if train_subset is not None:
        data.info.setdefault("train_size_full", len(data.train))
        data.train = Subset(data.train, subset_indices(len(data.train), train_subset, seed))
    for split in ("val", "test"):  # LONGRANGE_SMOKE=1: the first examples only
        dataset = getattr(data, split)
        keep = smoke.eval_size(len(dataset))
        if keep < len(dataset):
            setattr(data, split, Subset(dataset, range(keep)))
    return data


def task_status(name: str, data_dir: str | os.PathLike | None = None, generate: str | Mapping[str, Any] | None = None,
                **options) -> tuple[bool, list[str]]:
    """Whether the task's files are present, and one human-readable line per expected path
    (``generate``: of that generated configuration, see :func:`load_task`)."""
    entry = _entry(name)
    opts = _resolve_options(name, options)
    if entry.generated is not None:
        return True, [f"generated when loaded (generator version {entry.generated}); no files"]
    root = default_data_dir(data_dir) if generate is None else generated_root(name, data_dir, generate, opts)
    if entry.expected is None:
        return root.exists(), [f"{root}: {'found' if root.exists() else 'missing'} (no file list for this task)"]
    lines, present = [], True
    for path in entry.expected(root, **opts):
        ok = Path(path).exists()
        present &= ok
        lines.append(f"{path}: {'found' if ok else 'missing'}")
    return present, lines


def present_files(name: str, data_dir: str | os.PathLike | None = None, **options) -> list[Path]:
    """The task's own files (those its loader reads, not generated data) that are present in the data
    directory; [] for a task without a file list or whose data is drawn when loaded."""
    entry = _entry(name)
    if entry.generated is not None or entry.expected is None:
        return []
    opts = _resolve_options(name, options)
    return [Path(p) for p in entry.expected(default_data_dir(data_dir), **opts) if Path(p).exists()]


def data_identity(name: str, data_dir: str | os.PathLike | None = None,
                  generate: str | Mapping[str, Any] | None = None, **options) -> dict[str, str]:
    """What identifies the data a run reads, without loading it: the resolved data directory and a
    hash of the task's expected files (resolved path, size and modification time of each file, as
    the cache keys; see ``data/cache.py``). Replacing or editing a file changes the hash.

    A task generated when loaded reads no directory: its identity is the generator's version (its
    options and seed are in the run's task settings). Generated data (``generate``) is identified by
    its configuration instead (every generator option and the generator's version: the files are a
    function of them), so the identity is the same before the data is built, after, and after it is
    built again."""
    from longrange.data.cache import _source_fingerprint

    entry = _entry(name)
    opts = _resolve_options(name, options)
    shrunk = {"smoke": smoke.IDENTITY} if smoke.active() else {}  # never the identity of the whole data
    if entry.generated is not None:
        return {"dir": DRAWN_WHEN_LOADED, "generator": f"{name} v{entry.generated}", **shrunk}
    root = default_data_dir(data_dir)
    if generate is not None:
        config, key, _ = _generated(name, generate, opts)
        return {"dir": str(root.resolve()), "generated": f"{config}-{key}", **shrunk}
    rows: list = []
    if entry.expected is not None:
        for path in entry.expected(root, **opts):
            rows.append(_source_fingerprint(Path(path)) if Path(path).exists() else [str(path), "missing"])
    text = json.dumps(rows, sort_keys=True, default=str)
    return {"dir": str(root.resolve()), "files": hashlib.sha256(text.encode()).hexdigest()[:16], **shrunk}


# Generated data ------------------------------------------------------------------------------------

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


def register_generator(task: str, build: Callable[..., Any], defaults: Mapping[str, Any],
                       configurations: Mapping[str, Mapping[str, Any]] | None = None, *, version: int = 1,
                       from_task: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
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


def _generated(task: str, generate: str | Mapping[str, Any], task_options: Mapping[str, Any]) -> tuple[str, str, dict]:
    """(configuration name, hash of the options, resolved generator options) of ``generate``."""
    gen = generator(task)
    if gen is None:
        able = ", ".join(GENERATORS.names()) or "none"
        raise ConfigError(f"task.generate: the data of task {task} cannot be generated (tasks with a generator: "
                          f"{able}); remove task.generate to read its files")
    if isinstance(generate, str):
        config, values = generate, {}
    elif isinstance(generate, Mapping):
        values = dict(generate)
        config = str(values.pop("config", "default"))
    else:
        raise ConfigError(f"task.generate must be a configuration name or a mapping of generator options, got {generate!r}")
    options = gen.options(config, values, task)
    if gen.from_task is not None:
        for key, value in gen.from_task(dict(task_options)).items():
            if key in values and values[key] != value:
                raise ConfigError(f"task.generate.{key}={values[key]!r} contradicts the task's options, which need "
                                  f"{key}={value!r}; set the task option instead")
            options[key] = value
    options = smoke.generated_sizes(options)  # LONGRANGE_SMOKE=1: small, in a directory of its own
    text = json.dumps({"task": task, "version": gen.version, "options": options}, sort_keys=True, default=str)
    return config, hashlib.sha256(text.encode()).hexdigest()[:10], options


def generated_root(task: str, data_dir: str | os.PathLike | None, generate: str | Mapping[str, Any],
                   task_options: Mapping[str, Any] | None = None) -> Path:
    """The data directory of a generated configuration (it may not exist yet)."""
    opts = _resolve_options(task, dict(task_options or {}))
    config, key, _ = _generated(task, generate, opts)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in config)
    return default_data_dir(data_dir) / GENERATED_DIR / task / f"{safe}-{key}"


def ensure_generated(task: str, data_dir: str | os.PathLike | None, generate: str | Mapping[str, Any],
                     task_options: Mapping[str, Any] | None = None, *, quiet: bool = False) -> Path:
    """The data directory of a generated configuration, built first if it is not there.

    It is built in a directory beside it and renamed into place when complete, with a
    ``generated.json`` that records the options; when another process finished first, its build is
    kept and this one discarded. One line on stderr says what is generated and where, another how
    long it took (``quiet``: none)."""
    opts = _resolve_options(task, dict(task_options or {}))
    root = generated_root(task, data_dir, generate, opts)
    config, key, options = _generated(task, generate, opts)
    manifest_path = root / GENERATED_MANIFEST
    if manifest_path.is_file():
        try:
            made = json.loads(manifest_path.read_text()).get("options")
        except (OSError, ValueError, AttributeError):
            made = None
        if made != json.loads(json.dumps(options, default=str)):
            raise DataFormatError(f"the generated data in {root} was made with other options than {options}; "
                                  "delete that directory to generate it again", manifest_path)
        return root
    gen = generator(task)
    shown = ", ".join(f"{k}={v}" for k, v in options.items())
    if not quiet:
        print(f"generating {task} data {config!r} ({shown}) into {root} on first use; later runs reuse it",
              file=sys.stderr, flush=True)
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


@dataclass
class DataState:
    """Where a task's data stands, without loading it (:func:`data_state`)."""

    present: bool
    generated: bool          # built on first use from a generator
    root: Path               # the data directory the loader reads
    missing: list[Path]      # expected files that are not there
    obtain: str              # how to get them (for data that cannot be generated)

    def describe(self, name: str) -> str:
        if self.present and str(self.root) == DRAWN_WHEN_LOADED:
            return f"{name}: drawn when the task is loaded (nothing on disk)"
        if self.present:
            return f"{name}: present in {self.root}"
        if self.generated:
            return f"{name}: generated on first use into {self.root}"
        first = self.missing[0] if self.missing else self.root
        return f"{name}: MISSING {first}; {self.obtain}"


def data_state(name: str, data_dir: str | os.PathLike | None = None, generate: str | Mapping[str, Any] | None = None,
               **options) -> DataState:
    """Whether the task's data is present, will be generated on first use, or is missing (with the
    first missing file and how to obtain it)."""
    entry = _entry(name)
    opts = _resolve_options(name, options)
    if entry.generated is not None:  # drawn when loaded: nothing on disk, nothing missing
        return DataState(True, True, Path(DRAWN_WHEN_LOADED), [], "")
    if generate is not None:
        root = generated_root(name, data_dir, generate, opts)
        present = (root / GENERATED_MANIFEST).is_file()
        return DataState(present, True, root, [] if present else [root], "")
    root = default_data_dir(data_dir)
    expected = entry.expected(root, **opts) if entry.expected is not None else [root]
    missing = [Path(p) for p in expected if not Path(p).exists()]
    obtain = entry.spec(**opts).obtain or "see `longrange data info " + name + "`"
    return DataState(not missing, False, root, missing, obtain)


# Helpers for loaders ------------------------------------------------------------------------------

def require_files(paths: Sequence[Path], how_to_obtain: str) -> None:
    """DataMissingError naming the first missing path and how to obtain the data."""
    for path in paths:
        if not Path(path).exists():
            raise DataMissingError(f"expected {path} but it does not exist; {how_to_obtain}")


def read_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, text)`` of a UTF-8 text file, line numbers from 1, without line endings.

    Lines end at ``\n`` only (a ``\r`` before it is dropped; other ``\r`` stay inside the line).
    Raises DataMissingError if the file is absent and DataFormatError if it is empty or a line is
    not valid UTF-8.
    """
    path = Path(path)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise DataMissingError(f"expected {path} but it does not exist") from None
    with f:
        number = 0
        for number, raw in enumerate(f, start=1):
            if raw.endswith(b"\n"):
                raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataFormatError(f"not valid UTF-8 ({err.reason} at byte {err.start})", path, number) from None
        if number == 0:
            raise DataFormatError("empty file", path)


class BadRecords:
    """Counts malformed records per file when skipping them, or re-raises the error.

    Usage in a reader loop::

        try:
            ...parse the record...
        except DataFormatError as err:
            bad.handle(err)
            continue
    """

    def __init__(self, skip_bad: bool):
        self.skip_bad = skip_bad
        self.counts: dict[str, int] = {}

    def handle(self, err: DataFormatError) -> None:
        if not self.skip_bad:
            raise err
        key = str(err.path)
        self.counts[key] = self.counts.get(key, 0) + 1
