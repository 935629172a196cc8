"""Using a trained run: its model with the vocabulary and preprocessing of its task, predictions on
new inputs, and its metrics on a split, at the task options it was trained with or at others.

    from longrange import load_run
    run = load_run("runs/listops")                    # a finished run: best weights, eval mode
    run.model, run.vocab, run.spec                    # the model, the run's vocabulary, the task's spec
    records = run.read_inputs("new.tsv")              # the task's file format, encoded with the run's vocabulary
    for p in run.predict(records):
        print(p.id, p.text())
    run.evaluate("test").metrics                      # equal to summary.json's "test"
    run.evaluate("test", options={"seq_len": 4096})   # the same task at another length

:func:`load_model` rebuilds only the model (from ``config.yaml``'s ``model`` and ``head`` and the
best or last weights); the report's kernel analysis and finetuning (``experiment/weights.py``) use
it. Evaluation runs in batches that fit a memory budget (``train/memory.py``): at long lengths a
batch is split into smaller ones, down to one sequence, and a length whose single sequence needs
more than the budget is refused with the need and the budget named. A model that cannot take the
length asked for (a learned position table shorter than it) is refused naming its limit.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from longrange.errors import CheckpointError, ConfigError
from longrange.models.encoders import PositionalEmbedding
from longrange.models.model import SequenceModel
from longrange.models.record import HeadRecord
from longrange.train import memory as M
from longrange.train.checkpoint import load_weights
from longrange.train.memory import Budget, MemoryNeed
from longrange.train.rundir import RunDir
from longrange.train.rundir.record import RunRecord

SPLITS = ("train", "val", "test")
#: The summary's metrics of each split, where it has them.
SUMMARY_SPLIT = {"test": "test", "val": "best_val"}


def build_from_record(model_cfg: Mapping[str, Any], head: HeadRecord | Mapping[str, Any]) -> SequenceModel:
    """A freshly initialised model from a run's ``model`` and ``head`` sections
    (:class:`~longrange.models.record.HeadRecord`, or its saved form)."""
    return HeadRecord.from_json(head).build(model_cfg)


def _model_record(run: RunDir) -> dict[str, Any]:
    record = run.read_config(required=True)
    if "head" not in record or "model" not in record:
        raise CheckpointError(f"{run.config} does not describe a longrange model (no 'model'/'head')")
    return record


def _load_weights_of(run: RunDir, model: SequenceModel, which: str) -> SequenceModel:
    candidates = run.weights(which)
    for path in candidates:
        if path.is_file():
            load_weights(path, model)
            return model.eval()
    raise CheckpointError(f"{run.root} has no {which} weights ({', '.join(str(p) for p in candidates)})")


def load_model(run_dir: str | Path, which: str = "best") -> SequenceModel:
    """Rebuild a run's model from its config.yaml and load its best (or last) weights (eval mode).
    The model only: :func:`load_run` gives it with its vocabulary, task and evaluation."""
    run = RunDir(Path(run_dir))
    record = _model_record(run)
    return _load_weights_of(run, build_from_record(record["model"], record["head"]), which)


def input_length_limit(model: nn.Module) -> tuple[int, str] | None:
    """The longest input ``model`` can take and why (a learned position table), or None when any
    length goes. A module may declare its own limit as an integer attribute ``max_input_length``."""
    for module in model.modules():
        if isinstance(module, PositionalEmbedding) and module.kind == "learned":
            return module.max_len, f"its learned position table has {module.max_len} positions (model.max_len)"
        limit = getattr(module, "max_input_length", None)
        if isinstance(limit, int) and not isinstance(limit, bool):
            return limit, f"{type(module).__name__} takes at most {limit} positions"
    return None


# ------------------------------------------------------------------------------- results
@dataclass
class Prediction:
    """A model's prediction for one new input (:meth:`TrainedRun.predict`)."""

    id: str
    #: A class index (classification, retrieval), a list of values (regression) or a list of
    #: class indices, one per position (per-position heads), each in the task's own terms where
    #: its reader names them (the generated tasks' tokens, e.g.).
    value: Any
    target: Any = None
    #: The positions the task scores, where a per-position prediction is reported (``value`` and
    #: ``target`` hold one entry per position); None: the whole input, or every position.
    positions: list[int] | None = None

    def text(self) -> str:
        """The prediction as written by ``longrange predict``: a class index, or values separated by spaces."""
        return _text(self.value)

    def answers(self) -> list[tuple[Any, Any]]:
        """(prediction, target) of each answer: one per scored position, else the input's one."""
        if self.positions is not None:
            return list(zip(self.value, self.target or []))
        return [(self.value, self.target)]


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(_text(v) for v in value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


@dataclass
class Evaluation:
    """The metrics of a run on one split of its task at some task options (:meth:`TrainedRun.evaluate`)."""

    run: str
    task: str
    split: str
    #: The task options evaluated at (all of them), and those that differ from the run's.
    options: dict[str, Any]
    changed: dict[str, Any]
    #: The objective's metric of selection, and every metric it reports, unchanged.
    metric: str
    metrics: dict[str, float]
    items: int
    #: The longest sequence of the split (at most the task's seq_len): what the memory need is reckoned for.
    length: int
    batch_size: int
    memory: str
    device: str
    precision: str
    seconds: float
    #: The summary's metrics of this split when the options are the run's own (else None).
    summary: dict[str, float] | None = None
    #: Whether the data files are those the run was made with (None when the options differ).
    same_data: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


# ------------------------------------------------------------------------------- the run
@dataclass
class TrainedRun:
    """A finished run's model with what it needs to read new inputs and to be evaluated (:func:`load_run`)."""

    root: Path
    config: dict[str, Any]
    summary: dict[str, Any]
    model: SequenceModel
    device: torch.device
    _vocab: Any = field(default=None, repr=False)
    _needs: dict[Any, MemoryNeed] = field(default_factory=dict, repr=False)

    # -- what the run is
    @property
    def head(self) -> HeadRecord:
        """What the model was built for (the ``head`` section of its ``config.yaml``)."""
        return HeadRecord.from_json(self.config["head"], RunDir(self.root).config)

    @property
    def record(self) -> RunRecord:
        """What the run recorded beside its settings (the ``record`` section of its ``config.yaml``)."""
        return RunRecord.from_json(self.config.get("record"), RunDir(self.root).config)

    @property
    def task(self) -> dict[str, Any]:
        """The run's ``task`` section: name, options, data_dir, seed, skip_bad, train_subset."""
        return self.config["task"]

    @property
    def task_name(self) -> str:
        return str(self.task["name"])

    @property
    def label(self) -> str:
        """The run's name in tables: its experiment's label, regime and seed."""
        s = self.summary
        parts = [str(s.get("label") or self.root.name)]
        if s.get("regime") and s.get("regime") != "scratch":
            parts.append(str(s["regime"]))
        return ", ".join(parts) + (f", seed {s['seed']}" if "seed" in s else "")

    def options(self, changes: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The run's task options with ``changes`` applied, each checked: an unknown option is an
        error listing the task's options; a value of another type than the option's default is an
        error naming the option; the task's own checks name bad values."""
        from longrange.data.tasks import get_spec, task_options

        defaults = task_options(self.task_name)
        opts = {**defaults, **(self.task.get("options") or {})}
        for key, value in (changes or {}).items():
            if key not in defaults:
                from longrange.registry import unknown_option

                raise unknown_option(key, f"task {self.task_name}", list(defaults))
            opts[key] = _checked_option(self.task_name, key, value, defaults[key])
        get_spec(self.task_name, **opts)  # the task's own range checks
        return opts

    @property
    def spec(self):
        """The task's spec at the run's own options."""
        from longrange.data.tasks import get_spec

        return get_spec(self.task_name, **self.options())

    @property
    def vocab(self):
        """The run's vocabulary (token tasks; None for numeric inputs): the one saved in its record,
        or for runs that saved none, the task data's, which must be as large as the model's."""
        if self._vocab is None and self.head.input_kind == "tokens":
            from longrange.data.tokenize import Vocabulary

            saved = self.record.vocabulary
            if saved is not None:
                self._vocab = Vocabulary.from_dict(saved, RunDir(self.root).config)
            else:
                self._vocab = self._load_data(self.options()).vocab
                if self._vocab is not None and len(self._vocab) != self.head.vocab_size:
                    raise ConfigError(
                        f"the data's vocabulary ({len(self._vocab)} ids) is not the run's "
                        f"({self.head.vocab_size} ids): {self.root} saved none of its own"
                    )
        return self._vocab

    # -- checks of other task options
    def check_options(self, opts: Mapping[str, Any]):
        """The spec at ``opts``, after checking that the model can read its inputs: the same kind and
        number of classes, and lengths within the model's limit."""
        from longrange.data.tasks import get_spec

        spec = get_spec(self.task_name, **opts)
        own = self.spec
        changed = {k: v for k, v in opts.items() if self.options().get(k) != v}
        shown = ", ".join(f"{k}={v}" for k, v in changed.items())
        for what, mine, theirs in (
            ("input kind", own.input_kind, spec.input_kind),
            ("classes", own.n_classes, spec.n_classes),
            ("input channels", own.d_input, spec.d_input),
            ("targets", own.n_targets, spec.n_targets),
        ):
            if mine != theirs:
                raise ConfigError(
                    f"task option(s) {shown} change the task's {what} from {mine} to {theirs}; "
                    f"the model of {self.root} was made for {mine}"
                )
        limit = input_length_limit(self.model)
        if limit is not None and spec.seq_len > limit[0] and spec.seq_len != own.seq_len:
            raise ConfigError(
                f"the model of {self.root} cannot take inputs of {spec.seq_len} positions ({shown}): {limit[1]}, "
                f"so it reads at most {limit[0]}; evaluate at a length of at most {limit[0]}, or train a model "
                "whose positions do not end (model.pos_embedding=sinusoidal or none, or model.rope=true)"
            )
        return spec

    # -- memory
    def _precision(self):
        from longrange.train.precision import Precision

        name = str((self.config.get("train") or {}).get("precision", "fp32"))
        try:
            return Precision(name, self.device)
        except ConfigError:  # fp16 needs CUDA: evaluate in fp32 elsewhere
            return Precision("fp32", self.device)

    def need(self, length: int) -> MemoryNeed:
        """What one sequence of ``length`` positions needs in evaluation (measured once per probe set)."""
        key = length if length <= M.PROBE_LENGTHS[-1] else "fit"
        if key not in self._needs:
            self._needs[key] = M.measure_need(self.model, self.head, length, self._precision().autocast())
        return self._needs[key]

    def batch_size(self, length: int, most: int, budget: str | int | Budget | None = None, what: str = "") -> int:
        """The largest batch up to ``most`` whose evaluation at ``length`` fits the memory ``budget``."""
        budget = budget if isinstance(budget, Budget) else M.memory_budget(self.device, budget)
        return self.need(length).batch_size(length, budget, most, what or f"evaluating {self.root} at length {length}")

    def default_batch_size(self) -> int:
        """The run's own evaluation batch (``train.eval_batch_size``, else its micro-batch)."""
        from longrange.train.config import TrainConfig

        cfg = TrainConfig.from_dict(self.config.get("train") or {})
        return cfg.eval_batch_size or cfg.micro_batch(1)

    # -- new inputs
    def read_inputs(self, path: str | Path, options: Mapping[str, Any] | None = None):
        """The records of a file in the task's format (``data/inputs.py``), encoded with the run's vocabulary."""
        from longrange.data.inputs import read_inputs

        opts = self.options(options)
        spec = self.check_options(opts)
        return read_inputs(self.task_name, path, self.vocab, spec, **opts)

    @torch.no_grad()
    def predict(
        self, records: Sequence[Any], batch_size: int | None = None, memory_budget: str | int | None = None
    ) -> list[Prediction]:
        """The model's prediction for each record (:class:`~longrange.data.inputs.InputRecord`), in order."""
        from longrange.data.batch import collate
        from longrange.train.evaluation import move_to

        if not records:
            return []
        pad = self.vocab.pad_id if self.vocab is not None else 0
        longest = max(_length(r.item) for r in records)
        limit = input_length_limit(self.model)
        if limit is not None and longest > limit[0]:
            at = next(r.id for r in records if _length(r.item) == longest)
            raise ConfigError(
                f"input {at} has {longest} positions, but the model of {self.root} reads at most {limit[0]}: {limit[1]}"
            )
        size = self.batch_size(
            longest,
            batch_size or self.default_batch_size(),
            memory_budget,
            f"predicting with {self.root} on inputs of {longest} positions",
        )
        precision = self._precision()
        out: list[Prediction] = []
        for start in range(0, len(records), size):
            chunk = records[start : start + size]
            items = [{**r.item, "target": r.item.get("target", torch.tensor(0))} for r in chunk]
            batch = move_to(collate(items, pad_id=pad), self.device)
            with precision.autocast():
                outputs = self.model(batch["inputs"], batch.get("lengths"), batch.get("inputs2"), batch.get("lengths2"))
            values = _decode(outputs.float(), self.model, batch.get("lengths"))
            out.extend(_prediction(r, v) for r, v in zip(chunk, values))
        return out

    # -- evaluation
    def _data_dir(self, data_dir: str | Path | None) -> str | None:
        if data_dir is not None:
            return str(data_dir)
        recorded = self.record.data_dir  # where the run read its data, resolved
        if recorded and Path(recorded).is_dir():
            return str(recorded)
        return self.task.get("data_dir")

    def _load_data(self, opts: Mapping[str, Any], data_dir: str | Path | None = None):
        from longrange.data.tasks import load_task

        return load_task(
            self.task_name,
            self._data_dir(data_dir),
            seed=int(self.task.get("seed", 0)),
            skip_bad=bool(self.task.get("skip_bad", False)),
            generate=self.task.get("generate"),
            **opts,
        )

    def objective(self, data: Any):
        """The objective the run was trained with, built on ``data`` (its metrics are the evaluation's)."""
        from longrange import typed
        from longrange.objectives.factory import ObjectiveConfig, make_objective

        section = dict(self.config.get("objective") or {})
        kind, reverse = section.pop("kind", "supervised"), bool(section.pop("reverse", False))
        return make_objective(kind, data, typed.from_dict(ObjectiveConfig, section, "objective"), reverse=reverse)[0]

    def evaluate(
        self,
        split: str = "test",
        options: Mapping[str, Any] | None = None,
        *,
        data_dir: str | Path | None = None,
        batch_size: int | None = None,
        memory_budget: str | int | None = None,
    ) -> Evaluation:
        """The run's metrics on ``split`` of its task at its own options changed by ``options``.

        Batches are the run's evaluation batches, made smaller where the memory budget requires;
        at the run's own options on the same device the metrics equal its summary's.
        """
        from longrange.data.state import data_state
        from longrange.train import distributed as D
        from longrange.train.evaluation import Evaluator
        from longrange.train.sampler import make_loader

        if split not in SPLITS:
            raise ConfigError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        opts = self.options(options)
        changed = {k: v for k, v in opts.items() if self.options().get(k) != v}
        spec = self.check_options(opts)
        budget = memory_budget if isinstance(memory_budget, Budget) else M.memory_budget(self.device, memory_budget)
        shown = ", ".join(f"{k}={v}" for k, v in changed.items()) or "its own options"
        data = self._load_data(opts, data_dir)
        if self.vocab is not None and data.vocab is not None and data.vocab != self.vocab:
            raise ConfigError(
                f"at {shown} task {self.task_name} builds another vocabulary ({len(data.vocab)} ids) "
                f"than the run's ({len(self.vocab)} ids): its token ids would not mean what the model learned"
            )
        dataset = getattr(data, split)
        length = min(spec.seq_len, _longest(dataset) or spec.seq_len)  # the longest batch the split makes
        size = self.batch_size(
            length,
            batch_size or self.default_batch_size(),
            budget,
            f"evaluating {self.root} on {self.task_name} at {shown}",
        )
        objective = self.objective(data)
        precision = self._precision()

        def loader(ds, batches, seed):
            return make_loader(ds, batches, data.collate, generator_seed=seed)

        env = D.DistEnv(device=self.device)
        torch.manual_seed(int(self.summary.get("seed", 0)))  # objectives that draw (masking) draw alike each time
        start = time.perf_counter()
        metrics = Evaluator(objective, precision, loader, env, size)(self.model, dataset, split)
        seconds = time.perf_counter() - start
        summary = same = None
        if not changed:
            summary = self.summary.get(SUMMARY_SPLIT.get(split, ""))
            recorded = (self.config.get("data") or {}).get("files")
            if recorded is not None:
                same = data_state(self.task_name, self._data_dir(data_dir), **opts).identity()["files"] == recorded
        return Evaluation(
            run=str(self.root),
            task=self.task_name,
            split=split,
            options=dict(opts),
            changed=changed,
            metric=objective.metric,
            metrics=metrics,
            items=len(dataset),
            length=length,
            batch_size=size,
            memory=self.need(length).describe(length),
            device=str(self.device),
            precision=precision.name,
            seconds=seconds,
            summary=summary,
            same_data=same,
        )


def _checked_option(task: str, key: str, value: Any, default: Any) -> Any:
    """``value`` for the task option ``key`` if it has the type of the option's default (an int
    for a float option is taken as a float); else a ConfigError naming the option."""
    if default is None or isinstance(value, type(default)) and (isinstance(value, bool) == isinstance(default, bool)):
        return value
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    kind = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        type(default), type(default).__name__
    )
    raise ConfigError(f"task option {key} of task {task} takes {kind}, got {value!r}")


def _length(item: Mapping[str, Any]) -> int:
    return max(int(item[key].shape[0]) for key in ("inputs", "inputs2") if key in item)


def _longest(dataset: Any) -> int | None:
    """The longest sequence of a :class:`~longrange.data.tasks.SequenceDataset` (or a Subset of
    one) without reading its items; None for other datasets."""
    indices = None
    if isinstance(dataset, torch.utils.data.Subset):
        dataset, indices = dataset.dataset, list(dataset.indices)
    columns = [getattr(dataset, name, None) for name in ("inputs", "inputs2")]
    columns = [c for c in columns if isinstance(c, list)]
    if not columns:
        return None
    lengths = [
        max(int(c[i].shape[0]) for c in columns) for i in (indices if indices is not None else range(len(columns[0])))
    ]
    return max(lengths, default=None)


def _prediction(record: Any, value: Any) -> Prediction:
    """The :class:`Prediction` of one record from its decoded output: at the record's scored
    positions only where it has them, named in the task's terms where its reader names classes."""
    target = record.item.get("target")
    target = None if target is None else target.tolist()
    positions = getattr(record, "positions", None)
    if positions is not None:
        if not isinstance(value, list):
            raise ConfigError(
                f"input {record.id} asks for predictions at positions, but the model of this run "
                "predicts one class per input (not a per-position head)"
            )
        value = [value[p] for p in positions]
        target = None if target is None else [target[p] for p in positions]
    name = getattr(record, "name_class", None)
    if name is not None and positions is None and isinstance(value, list):
        raise ConfigError(
            f"input {record.id} asks for one class, but the model of this run predicts at every "
            "position (a pretraining run?): predict with the run of a train or finetune stage"
        )
    if name is not None:
        value = [name(v) for v in value] if isinstance(value, list) else name(value)
        if target is not None:
            target = [name(t) for t in target] if isinstance(target, list) else name(target)
    return Prediction(record.id, value, target, None if positions is None else list(positions))


def _decode(outputs: Tensor, model: SequenceModel, lengths: Tensor | None) -> list[Any]:
    """Per item: the class (pooled classification and retrieval heads), the values (regression), or
    the class at each real position (per-position heads)."""
    kind = getattr(model, "head_kind", "classify")
    if getattr(model, "per_position", False) or outputs.dim() == 3:
        classes = outputs.argmax(-1).cpu()
        ends = lengths.cpu().tolist() if lengths is not None else [classes.shape[1]] * classes.shape[0]
        return [row[:n].tolist() for row, n in zip(classes, ends)]
    if kind == "regress":
        return [[float(v) for v in row] for row in outputs.cpu()]
    return outputs.argmax(-1).cpu().tolist()


def load_run(run_dir: str | Path, which: str = "best", device: str | torch.device | None = None) -> TrainedRun:
    """A finished run's model (``which``: its best or last weights, in eval mode on ``device``, by
    default the GPU if there is one) with its vocabulary, task and objective.

    A directory that holds no run, or a run that failed or has not finished, is an error that says
    so (:meth:`RunDir.require_finished`: a DataMissingError or an UnfinishedRunError).
    """
    from longrange.train.distributed import default_device

    run = RunDir(Path(run_dir))
    summary = run.require_finished(
        "run directory", f"finish it first (the same command with --resume --out {run.root})"
    )
    config = _model_record(run)
    model = _load_weights_of(run, build_from_record(config["model"], config["head"]), which)
    try:
        dev = torch.device(device) if device is not None else default_device()
    except RuntimeError as err:
        raise ConfigError(f"device {device!r}: {err}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r}: CUDA is not available here; use --device cpu")
    return TrainedRun(root=run.root, config=config, summary=summary, model=model.to(dev), device=dev)
