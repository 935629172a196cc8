"""A dry run of an experiment's stages: each stage's model and objective as a comparison builds them,
at the preset's published batch size and length, through one training step on a device that holds
no data, so that a run on a GPU fails here first, without a GPU and without memory.

    run = dry_run(resolve("spt/path-x/s4"), "pretrain", "masked")     # on the meta device
    run.describe()   # 'spt/path-x/s4 pretrain (masked): batch 32 x 16384 float32 ...'

What a step is: the stage resolved (``stage.py``) and built (``execute.build_stage``: objective,
head, model) on a stand-in for the task's data (:class:`StageData`: its spec and vocabulary, no
examples), one synthetic micro-batch per gradient-accumulation step (:func:`synthetic_batch`) of
``train.batch_size / train.grad_accum`` sequences at the task's full length, with inputs of the
task's kind (token ids, or real values with the task's channels) and targets of its objective;
then ``train/step.py``'s step: the objective's forward, the loss, backward, gradient clipping and
the AdamW step over the trainer's parameter groups.

On the ``meta`` device nothing is computed or allocated, and a tensor created on another device
inside a model or objective (``torch.zeros(n)`` without ``device=``) meets the meta tensors and
fails as it would meet CUDA tensors (PyTorch refuses to mix devices in both cases, except for
0-dimensional CPU tensors, which it accepts with either). Shapes and dtypes are those of a real run,
so shape errors at published sizes show too, and dtype errors: the meta device's shape functions
let a matrix product of float64 and float32 operands through, which CUDA refuses, so the step runs
under :class:`~longrange.ops.dataless.DtypeChecks`, which refuses it as CUDA does. The fused kernels run as their operators'
fake implementations (``ops/custom_ops.py``): on meta the dispatchers choose the kernels a GPU
runs (Triton's), not the chunked PyTorch code.

What cannot be known without data is taken as follows (:mod:`longrange.ops.dataless`): value
checks (token ids and labels in range) are skipped; a padding mask counts as left-aligned, as every
mask made from lengths is; a selection by value (the masked positions of masked pretraining, the
answer positions of per-position tasks) selects every position, PyTorch's
``meta_nonzero_assume_all_nonzero`` (an upper bound of the memory of what follows it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from longrange.errors import ConfigError
from longrange.experiment.config import ExperimentConfig, TaskConfig
from longrange.experiment.stage import ResolvedStage, resolve_stage

#: The device of a dry run.
META = torch.device("meta")


class DryRunError(RuntimeError):
    """A stage's dry run failed; the message names the experiment, stage, objective and sizes, and the
    error it met is chained (``__cause__``)."""


@dataclass
class StageData:
    """What building a stage reads of a task's loaded data (``TaskData``): its spec and vocabulary."""

    spec: Any
    vocab: Any = None

    @property
    def vocab_size(self) -> int | None:
        return None if self.vocab is None else len(self.vocab)


def stage_data(task: TaskConfig, vocab: int | None = None) -> StageData:
    """The spec and vocabulary of a stage's task, without its examples. Token tasks whose
    vocabulary does not depend on the data (ListOps, image levels, DNA) need no files; text and
    retrieval load theirs (an error naming the missing files) unless ``vocab`` gives its size."""
    import longrange.data  # noqa: F401  (registers the tasks)
    from longrange.data.tasks import get_spec
    from longrange.data.tokenize import SPECIALS, Vocabulary
    from longrange.experiment.params import fixed_vocabulary

    spec = get_spec(task.name, **task.options)
    if spec.input_kind != "tokens":
        return StageData(spec)
    if vocab is not None:
        if vocab <= len(SPECIALS):
            raise ConfigError(f"--vocab {vocab}: a vocabulary has {len(SPECIALS)} special tokens and at least one more")
        return StageData(spec, Vocabulary([f"t{i}" for i in range(vocab - len(SPECIALS))]))
    vocabulary = fixed_vocabulary(task.name, task.options)
    if vocabulary is None:
        from longrange.experiment.taskdata import load_data

        vocabulary = load_data(task).vocab
    return StageData(spec, vocabulary)


def pretraining_objectives(exp: ExperimentConfig) -> list[str]:
    """The objectives ``exp`` pretrains with: its ``compare.objectives``, else the model's natural one."""
    from longrange.objectives.factory import natural_objective

    return list(exp.compare.objectives) or [natural_objective(exp.model.direction)]


def dry_stages(exp: ExperimentConfig) -> list[tuple[str, str]]:
    """The (stage, objective) pairs of ``exp`` a dry run takes: supervised training, and when the
    experiment has a pretraining section, pretraining with each objective it compares
    (:func:`pretraining_objectives`). Finetuning builds the model of training from scratch (after
    loading weights) and is not a pair of its own."""
    pairs = [("train", "supervised")]
    if exp.pretrain or exp.compare.objectives:
        pairs += [("pretrain", objective) for objective in pretraining_objectives(exp)]
    return pairs


def synthetic_batch(
    spec: Any,
    batch_size: int,
    seq_len: int,
    *,
    vocab_size: int | None,
    device: torch.device | str,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """A batch of ``batch_size`` sequences of ``seq_len`` positions in the layout of ``data/batch.py``
    on ``device``: token ids (int64, drawn from the task's tokens) or values (float32, ``spec.d_input``
    channels), every length ``seq_len``, targets of the task's kind (class indices; regression
    values; per-position class indices with an answer at every position); two-sequence tasks get a
    second sequence alike."""
    from longrange.data.tokenize import FIRST_TOKEN_ID

    def inputs() -> Tensor:
        if spec.input_kind == "tokens":
            if not vocab_size or vocab_size <= FIRST_TOKEN_ID:
                raise ConfigError(f"task {spec.name}: a token batch needs the vocabulary size, got {vocab_size}")
            return torch.randint(FIRST_TOKEN_ID, vocab_size, (batch_size, seq_len), generator=generator, device=device)
        return torch.randn(batch_size, seq_len, spec.d_input, generator=generator, device=device)

    lengths = torch.full((batch_size,), seq_len, dtype=torch.long, device=device)
    batch = {"inputs": inputs(), "lengths": lengths}
    if spec.two_sequences:
        batch["inputs2"], batch["lengths2"] = inputs(), lengths.clone()
    if getattr(spec, "per_position", False):
        batch["targets"] = torch.randint(0, spec.n_classes, (batch_size, seq_len), generator=generator, device=device)
    elif spec.n_classes == 0:
        batch["targets"] = torch.randn(batch_size, spec.n_targets, generator=generator, device=device)
    else:
        batch["targets"] = torch.randint(0, spec.n_classes, (batch_size,), generator=generator, device=device)
    return batch


@contextmanager
def dataless_selections() -> Iterator[None]:
    """Selections by value on the meta device select every position (PyTorch's
    ``meta_nonzero_assume_all_nonzero``) while the block runs."""
    from torch.fx.experimental import _config

    with _config.patch(meta_nonzero_assume_all_nonzero=True):
        yield


@dataclass
class PreparedStep:
    """A stage built for one training step: its model, objective, optimiser, precision and micro-batches."""

    stage: ResolvedStage
    data: StageData
    model: Any
    objective: Any
    optimizer: Any
    precision: Any
    batches: list[dict[str, Tensor]]
    batch_size: int
    micro_batch: int
    seq_len: int

    def step(self, before_micro_batch: Callable[[int], None] | None = None) -> Tensor:
        """One training step (``train/step.py``)."""
        from longrange.train.step import training_step

        return training_step(
            self.model,
            self.objective,
            self.batches,
            self.optimizer,
            self.precision,
            self.stage.train.grad_clip,
            before_micro_batch,
        )


def prepare_step(
    exp: ExperimentConfig,
    stage: str = "train",
    objective: str | None = None,
    *,
    device: torch.device | str = META,
    batch_size: int | None = None,
    grad_accum: int | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
    micro_batches: int | None = None,
    precision: Any = None,
    generator: torch.Generator | None = None,
) -> PreparedStep:
    """Build ``exp``'s ``stage`` with ``objective`` on ``device`` for one training step.

    ``objective``: a pretraining stage's default is the first of :func:`pretraining_objectives`.
    ``batch_size`` and ``grad_accum`` (default the stage's ``train.batch_size`` and
    ``train.grad_accum``) are the step's global batch and its number of micro-batches, ``seq_len``
    (default the task's) its length; the step runs ``micro_batches`` of the micro-batches (default
    all). ``precision``: a :class:`~longrange.train.precision.Precision`-like object (default
    ``train.precision``'s on ``device``). ``vocab``: the vocabulary size of a token task (see
    :func:`stage_data`).
    """
    from longrange.experiment.execute import build_stage
    from longrange.train.optim import build_optimizer
    from longrange.train.precision import Precision

    device = torch.device(device)
    if device.type == "cpu":  # the allocator and float modes as training sets them: a timed step is the trained one
        from longrange.train.allocator import keep_freed_memory
        from longrange.train.denormals import flush_denormals

        keep_freed_memory()
        flush_denormals(device)  # for the process, not restored (as in a stage's process)
    if stage == "pretrain" and objective is None:
        objective = pretraining_objectives(exp)[0]
    resolved = resolve_stage(exp, stage, objective=objective)
    # The stage's own settings: smoke mode (LONGRANGE_SMOKE) shrinks runs, not what a dry run or a plan checks.
    changes = {k: v for k, v in (("batch_size", batch_size), ("grad_accum", grad_accum)) if v is not None}
    train_cfg = resolved.train = exp.train_config(stage, seed=resolved.seed, **changes)
    micro = train_cfg.micro_batch(1)
    data = stage_data(resolved.task, vocab)
    length = seq_len or data.spec.seq_len
    if precision is None:
        if device.type == "meta" and train_cfg.precision != "fp32":
            raise ConfigError(
                f"train.precision {train_cfg.precision!r}: the meta device has no autocast; plan the "
                "step with `longrange plan` (fake CPU tensors under CPU autocast) or dry-run it in fp32"
            )
        precision = Precision(train_cfg.precision, device)
    with torch.device(device):  # built where it runs: on meta nothing is allocated or initialised
        built = build_stage(resolved, data)
    model = built.model
    optimizer = build_optimizer(model, train_cfg)
    if device.type == "meta":  # meta stands for a GPU: AdamW's multi-tensor path, PyTorch's default on CUDA
        for group in optimizer.param_groups:
            group["foreach"] = True
    batches = [
        synthetic_batch(data.spec, micro, length, vocab_size=data.vocab_size, device=device, generator=generator)
        for _ in range(micro_batches or train_cfg.grad_accum)
    ]
    return PreparedStep(
        resolved, data, model, built.objective, optimizer, precision, batches, train_cfg.batch_size, micro, length
    )


@dataclass
class DryRun:
    """What a stage's dry run did."""

    name: str
    stage: str
    objective: str
    batch_size: int
    micro_batch: int
    seq_len: int
    inputs: str  # "int64 (32, 16384)"
    parameters: int
    device: str
    kernels: dict[str, str] = field(default_factory=dict)  # longrange.ops.used: the op -> implementation traced

    def describe(self) -> str:
        return (
            f"{self.name} {self.stage} ({self.objective}): batch {self.batch_size} (micro-batch {self.micro_batch}) "
            f"x {self.seq_len}, inputs {self.inputs}, {self.parameters:,} parameters on {self.device}"
            + (f"; kernels {', '.join(f'{k}={v}' for k, v in sorted(self.kernels.items()))}" if self.kernels else "")
        )


def dry_run(
    exp: ExperimentConfig,
    stage: str = "train",
    objective: str | None = None,
    *,
    name: str | None = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
) -> DryRun:
    """One training step of ``exp``'s ``stage`` on the meta device (see the module docstring).

    Errors in building the stage's settings are the ConfigErrors they are; an error of the step
    itself (a model or objective at fault) is a :class:`DryRunError` naming ``name`` (default the
    experiment's label), the stage, objective and sizes, with the original error chained.
    """
    from longrange.ops import used
    from longrange.ops.dataless import DtypeChecks, fake_mode

    name = name or exp.label
    # A Hugging Face LM's own code reads mask values unless its tensors are fake (it then takes
    # them for traced ones): those models run on fake meta tensors; the others on plain meta
    # tensors, three times faster (PyTorch's FakeTensorMode adds its own bookkeeping to every op).
    mode = fake_mode() if exp.model.block == "hf" else dataless_selections()
    with mode:
        prepared = prepare_step(exp, stage, objective, device=META, batch_size=batch_size, seq_len=seq_len, vocab=vocab)
        kind = prepared.stage.objective
        first = prepared.batches[0]["inputs"]
        where = (
            f"the dry run of {name} ({stage}, objective {kind}) at batch {prepared.batch_size} "
            f"(micro-batch {prepared.micro_batch}) x length {prepared.seq_len} on {META.type}"
        )
        used.reset()
        try:
            with DtypeChecks():
                prepared.step()
        except Exception as err:
            raise DryRunError(f"{where} failed: {type(err).__name__}: {err}") from err
    parameters = sum(p.numel() for p in prepared.model.parameters())
    return DryRun(
        name,
        stage,
        kind,
        prepared.batch_size,
        prepared.micro_batch,
        prepared.seq_len,
        f"{str(first.dtype).removeprefix('torch.')} {tuple(first.shape)}",
        parameters,
        META.type,
        dict(used.kernels()),
    )
