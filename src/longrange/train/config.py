"""The training configuration: one flat dataclass, saved with every run.

Conventions:
  * ``batch_size`` is the GLOBAL batch size of one optimiser step. Each of ``world_size`` ranks
    processes ``batch_size / world_size`` items per step, in ``grad_accum`` micro-batches of
    ``batch_size / world_size / grad_accum`` items.
  * A *step* is one optimiser step. ``max_steps > 0`` fixes the length of training; otherwise it is
    ``epochs`` passes over the training set (the last incomplete global batch is dropped).
  * ``warmup`` below 1 is a fraction of the total steps; 1 or more is a number of steps.
  * ``param_groups`` are rules by parameter name, ``{match: GLOB, lr: X | lr_scale: X,
    weight_decay: X}``, applied in order before the layers' optimiser hints (first match wins;
    see ``train/optim.py``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from longrange import typed
from longrange.errors import ConfigError
from longrange.identity import declare_defaults

SCHEDULES = ("cosine", "constant", "plateau", "step", "rsqrt")
CYCLES = ("once", "periodic", "restart")
STEP_UNITS = ("step", "epoch")
PRECISIONS = ("fp32", "bf16", "fp16")
LOGGERS = ("tensorboard", "wandb")
WANDB_MISSING = "train.loggers asks for wandb, which is not installed: pip install 'longrange[wandb]'"
WANDB_MODES = ("online", "offline", "disabled")


@dataclass
class WandbConfig:
    """Where a run logs in Weights & Biases (``train.loggers: [..., wandb]``). The run's name is its
    stage id (a comparison's run directory relative to its output; else the directory's name)."""

    #: The W&B project.
    project: str = "longrange"
    #: The W&B entity (user or team); None: the account's default.
    entity: str | None = None
    #: Default: a comparison's output directory's name (its grid in one group); none for one run.
    group: str | None = None
    #: online, offline or disabled; None: W&B's own choice (``WANDB_MODE``, else online).
    mode: str | None = None


@dataclass
class TrainConfig:
    """How a stage trains: the optimiser (AdamW), the learning-rate schedule, the run's length and
    batches, evaluation, checkpoints and logging. A step is one optimiser step; ``batch_size`` is
    the global batch of one step."""

    # Optimiser: AdamW.
    #: AdamW's peak learning rate (the schedule's; with schedule ``rsqrt``, LRA's constant).
    lr: float = 1e-3
    #: AdamW's weight decay.
    weight_decay: float = 0.01
    #: AdamW's (beta1, beta2).
    betas: tuple[float, float] = (0.9, 0.999)
    #: AdamW's epsilon.
    eps: float = 1e-8
    #: Learning-rate scale (a multiple of ``lr``) of parameters hinted ``group="ssm"``.
    ssm_lr_scale: float = 0.1
    #: Weight decay of parameters hinted ``group="ssm"``.
    ssm_weight_decay: float = 0.0
    #: False puts every parameter with fewer than 2 dimensions (biases, norm gains) that carries
    #: no hint into the no-decay group.
    weight_decay_1d: bool = True
    #: Rules by parameter name, first match wins, before the hints: each ``{match: <glob on the
    #: qualified name, e.g. "*.log_dt">, lr: <absolute> | lr_scale: <x lr>, weight_decay: <float>}``.
    param_groups: list[dict[str, Any]] = field(default_factory=list)

    # Learning-rate schedule.
    #: The learning-rate schedule (``train/schedules.py``): cosine, constant, plateau, step, or rsqrt
    #: (LRA's constant * linear_warmup * rsqrt_decay, with ``lr`` as LRA's constant).
    schedule: str = "cosine"
    #: Linear warmup: below 1 a fraction of the run's steps, 1 or more a number of steps.
    warmup: float = 0.1
    #: The cosine's final ratio of the peak lr (reached at the end of its decay).
    min_lr_ratio: float = 0.1
    #: Cosine only: steps from step 0 (warmup included) to the end of one decay; 0 = the whole run.
    cosine_steps: int = 0
    #: Cosine only, after the decay's end: ``once`` (hold the final ratio), ``periodic`` (rise back
    #: along the cosine, as transformers' schedule past num_training_steps) or ``restart`` (back to
    #: the peak, as LRA's cosine_decay).
    cycles: str = "once"
    #: Schedule ``plateau``: the lr is multiplied by this factor each time ``plateau_patience``
    #: evaluations in a row did not improve the selection metric.
    plateau_factor: float = 0.5
    #: Schedule ``plateau``: evaluations without improvement before the lr is reduced.
    plateau_patience: int = 3
    #: Step decay (``schedule: step``): the lr is multiplied by ``step_gamma`` every ``step_size``
    #: optimiser steps (or epochs, with ``step_unit: epoch``) after the warmup.
    step_size: int = 0
    #: Schedule ``step``: the factor applied every ``step_size`` steps or epochs.
    step_gamma: float = 0.1
    #: Schedule ``step``: whether ``step_size`` counts optimiser steps or epochs.
    step_unit: str = "step"

    # Length and batching.
    #: Passes over the training set (the last incomplete global batch of each is dropped).
    epochs: int = 10
    #: The run's optimiser steps; 0 = ``epochs`` passes.
    max_steps: int = 0
    #: The global batch of one optimiser step, over every rank and micro-batch.
    batch_size: int = 32
    #: Items per rank in one evaluation batch; 0 = the training micro-batch.
    eval_batch_size: int = 0
    #: Micro-batches per optimiser step on each rank (each of batch_size / world size / grad_accum items).
    grad_accum: int = 1
    #: Clip the gradients' global norm to this value; 0 = off.
    grad_clip: float = 0.0
    #: fp32; bf16 (autocast to bfloat16, CPU or CUDA); fp16 (autocast to float16 with loss scaling, CUDA).
    precision: str = "fp32"

    # Evaluation, checkpoints, logging.
    #: 0 = evaluate at the end of each epoch; N = every N steps. Always also at the end.
    eval_every: int = 0
    #: Early stopping after this many evaluations without improvement; 0 = off.
    patience: int = 0
    #: Save ``last.pt`` every N steps (0 = only at evaluations and at the end).
    checkpoint_every: int = 0
    #: Log the training metrics (metrics.jsonl, TensorBoard, W&B) every N steps.
    log_every: int = 10
    #: A progress bar on a terminal; elsewhere (nohup, SLURM, ``> log``) a plain line every
    #: ``progress_every`` seconds with step/total, loss, lr, the last validation metric and the ETA.
    progress: bool = True
    #: Seconds between two plain progress lines (not on a terminal).
    progress_every: float = 60.0
    #: Where metrics go besides metrics.jsonl: ``tensorboard`` (when installed) and ``wandb``
    #: (``pip install 'longrange[wandb]'``; settings in ``wandb``).
    loggers: list[str] = field(default_factory=lambda: ["tensorboard"])
    #: Where a run logs in Weights & Biases, with ``loggers: [..., wandb]``.
    wandb: WandbConfig = field(default_factory=WandbConfig)

    #: Seconds without a heartbeat (the run refreshes its lock every 30 s) after which another host
    #: may take this run's lock over: a node that died frees its runs within minutes.
    lock_stale_after: float = 300.0

    #: The seed of the initialisation, dropout, masking and data order (a comparison sets it per stage
    #: from ``compare.seeds``; ``--seed`` on the command line; written in an experiment, it is the
    #: stage's seed, and another asked for by either is an error).
    seed: int = 0
    #: DataLoader worker processes; 0 = load in the training process.
    num_workers: int = 0
    #: DistributedDataParallel option, needed when some parameters get no gradient in a step
    #: (e.g. a classification head during pretraining).
    find_unused_parameters: bool = False
    #: PyTorch's deterministic algorithms, cuDNN deterministic and not benchmarking, cuBLAS's
    #: deterministic workspace, and only deterministic kernels (see ``train/environment.py``).
    deterministic: bool = False
    #: Train the model compiled with ``torch.compile`` (Inductor; see ``train/compile.py``): the
    #: same computation to float rounding, faster after the first steps, which compile it.
    compile: bool = False
    #: Read the test split once training ends (its metrics in the summary's ``test``). False for
    #: screening runs, whose choices of settings must not see it: their summary's ``test`` is null.
    test_split: bool = True

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        def need(ok: bool, name: str, what: str) -> None:
            if not ok:
                raise ConfigError(f"train.{name} {what}, got {getattr(self, name)!r}")

        need(self.lr > 0 and math.isfinite(self.lr), "lr", "must be a positive number")
        need(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        need(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "betas", "must be two numbers in [0, 1)")
        need(self.eps > 0, "eps", "must be > 0")
        need(self.ssm_lr_scale > 0, "ssm_lr_scale", "must be > 0")
        need(self.ssm_weight_decay >= 0, "ssm_weight_decay", "must be >= 0")
        need(self.schedule in SCHEDULES, "schedule", f"must be one of {', '.join(SCHEDULES)}")
        need(self.warmup >= 0, "warmup", "must be >= 0 (a fraction of the steps if < 1, else a number of steps)")
        need(self.warmup < 1 or float(self.warmup).is_integer(), "warmup", "must be a whole number of steps when >= 1")
        need(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", "must be in [0, 1]")
        need(self.cosine_steps >= 0, "cosine_steps", "must be >= 0 (0 = the cosine spans the run)")
        need(self.cycles in CYCLES, "cycles", f"must be one of {', '.join(CYCLES)}")
        need(
            self.schedule != "rsqrt" or self.warmup > 0,
            "warmup",
            "must be > 0 for schedule 'rsqrt' (it decays as 1 / sqrt(max(step, warmup)))",
        )
        need(
            self.schedule != "cosine"
            or not (self.cosine_steps and self.warmup >= 1 and self.cosine_steps <= self.warmup),
            "cosine_steps",
            f"must exceed train.warmup ({self.warmup:g} steps): it counts the steps from 0 to the end of the decay",
        )
        need(0 < self.plateau_factor < 1, "plateau_factor", "must be in (0, 1)")
        need(self.plateau_patience >= 1, "plateau_patience", "must be >= 1")
        need(
            self.schedule != "step" or self.step_size >= 1,
            "step_size",
            "must be >= 1 (steps, or epochs with step_unit 'epoch', between decays) for schedule 'step'",
        )
        need(self.step_size >= 0, "step_size", "must be >= 0")
        need(0 < self.step_gamma <= 1, "step_gamma", "must be in (0, 1]")
        need(self.step_unit in STEP_UNITS, "step_unit", f"must be one of {', '.join(STEP_UNITS)}")
        need(self.epochs >= 1 or self.max_steps >= 1, "epochs", "must be >= 1 (or set max_steps)")
        need(self.max_steps >= 0, "max_steps", "must be >= 0 (0 = use epochs)")
        need(self.batch_size >= 1, "batch_size", "must be >= 1")
        need(self.eval_batch_size >= 0, "eval_batch_size", "must be >= 0")
        need(self.grad_accum >= 1, "grad_accum", "must be >= 1")
        need(self.grad_clip >= 0, "grad_clip", "must be >= 0 (0 = off)")
        need(self.precision in PRECISIONS, "precision", f"must be one of {', '.join(PRECISIONS)}")
        need(self.eval_every >= 0, "eval_every", "must be >= 0 (0 = each epoch)")
        need(self.patience >= 0, "patience", "must be >= 0 (0 = off)")
        need(self.checkpoint_every >= 0, "checkpoint_every", "must be >= 0")
        need(self.log_every >= 1, "log_every", "must be >= 1")
        need(self.progress_every > 0, "progress_every", "must be > 0 seconds")
        need(self.num_workers >= 0, "num_workers", "must be >= 0")
        need(isinstance(self.compile, bool), "compile", "must be true or false")
        need(isinstance(self.test_split, bool), "test_split", "must be true or false")
        if isinstance(self.wandb, Mapping):  # constructed directly with a dict
            self.wandb = typed.from_dict(WandbConfig, self.wandb, "train.wandb")
        need(
            all(name in LOGGERS for name in self.loggers) and len(set(self.loggers)) == len(self.loggers),
            "loggers",
            f"must be a list of distinct names among {', '.join(LOGGERS)}",
        )
        if self.wandb.mode is not None and self.wandb.mode not in WANDB_MODES:
            raise ConfigError(
                f"train.wandb.mode must be one of {', '.join(WANDB_MODES)} (or unset), got {self.wandb.mode!r}"
            )
        if "wandb" in self.loggers and not _wandb_installed():
            raise ConfigError(WANDB_MISSING)
        need(self.lock_stale_after >= 60, "lock_stale_after", "must be >= 60 seconds (two heartbeats at least)")
        need(
            isinstance(self.param_groups, (list, tuple)),
            "param_groups",
            "must be a list of rules {match: GLOB, lr | lr_scale, weight_decay}",
        )
        self.param_groups = [_param_rule(i, rule) for i, rule in enumerate(self.param_groups)]

    def per_rank_batch(self, world_size: int) -> int:
        """Items per rank in one optimiser step."""
        if self.batch_size % world_size:
            raise ConfigError(
                f"train.batch_size {self.batch_size} (the global batch) is not divisible by the world size {world_size}"
            )
        return self.batch_size // world_size

    def micro_batch(self, world_size: int) -> int:
        """Items per rank in one forward/backward pass."""
        per_rank = self.per_rank_batch(world_size)
        if per_rank % self.grad_accum:
            raise ConfigError(
                f"train.batch_size {self.batch_size} / world size {world_size} = {per_rank} items per rank "
                f"is not divisible by train.grad_accum {self.grad_accum}"
            )
        return per_rank // self.grad_accum

    def warmup_steps(self, total_steps: int) -> int:
        return int(round(self.warmup * total_steps)) if self.warmup < 1 else int(self.warmup)

    # ------------------------------------------------------------ conversion
    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["betas"] = list(self.betas)
        out["loggers"] = list(self.loggers)
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str = "train") -> TrainConfig:
        """Build from plain values (e.g. YAML). Unknown fields and wrong types raise ConfigError naming
        the dotted field (see ``longrange.typed``)."""
        return typed.from_dict(cls, data, where)


#: Fields at their default are left out of a run's identity (a new field changes no fingerprint).
declare_defaults("train", lambda: TrainConfig().to_dict())


def _wandb_installed() -> bool:
    from longrange import _optional  # imported when asked: it looks for the optional GPU packages

    return _optional.installed("wandb")


PARAM_RULE_FIELDS = ("match", "lr", "lr_scale", "weight_decay")


def _param_rule(index: int, rule: Any) -> dict[str, Any]:
    """A checked ``train.param_groups`` rule with float values."""
    where = f"param_groups[{index}]"
    if not isinstance(rule, Mapping):
        raise ConfigError(f"train.{where} must be a mapping {{match: GLOB, lr | lr_scale, weight_decay}}, got {rule!r}")
    unknown = sorted(set(rule) - set(PARAM_RULE_FIELDS))
    if unknown:
        raise ConfigError(
            f"train.{where} has unknown key(s) {', '.join(unknown)}; known: {', '.join(PARAM_RULE_FIELDS)}"
        )
    pattern = rule.get("match")
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError(f"train.{where}.match must be a glob on parameter names (e.g. '*.log_dt'), got {pattern!r}")
    if "lr" in rule and "lr_scale" in rule:
        raise ConfigError(f"train.{where} (match {pattern!r}) sets both lr and lr_scale; give one")
    if not any(k in rule for k in ("lr", "lr_scale", "weight_decay")):
        raise ConfigError(f"train.{where} (match {pattern!r}) sets none of lr, lr_scale, weight_decay")
    out: dict[str, Any] = {"match": pattern}
    for key in ("lr", "lr_scale", "weight_decay"):
        if key in rule:
            value = typed.convert(rule[key], float, f"train.{where}.{key}")
            if not math.isfinite(value) or value < 0 or (key != "weight_decay" and value == 0):
                raise ConfigError(
                    f"train.{where}.{key} must be {'>= 0' if key == 'weight_decay' else '> 0'}, got {value!r}"
                )
            out[key] = value
    return out
