"""The training loop: plain PyTorch, readable top to bottom.

    trainer = Trainer(model, objective, train_set, val_set, collate, cfg, run_dir, test_set=test_set)
    summary = trainer.fit()          # {"best": ..., "final": ..., "test": ..., ...}

A run is a directory::

    run_dir/config.yaml              the resolved configuration ({"train": ..., **extra_config}) and
                                     its fingerprint (see ``train/rundir.py``)
    run_dir/metrics.jsonl            one JSON record per log line (see ``train/logging.py``)
    run_dir/checkpoints/last.pt      everything needed to continue exactly (``resume=True``): model,
                                     optimiser, schedule, RNG states and the :class:`TrainerState`
    run_dir/checkpoints/best.safetensors   the model weights at the best evaluation of ``objective.metric``
    run_dir/tensorboard/             TensorBoard events, when tensorboard is installed
    run_dir/.lock                    held while a process trains in the directory

A non-finite training loss, validation metric or parameter stops the run with a
:class:`~longrange.errors.TrainingDivergedError` naming the step and the last good checkpoint
(``last.pt`` only ever holds finite weights).

One step = one optimiser step over a global batch of ``cfg.batch_size`` items, split over ranks
and micro-batches (see ``train/sampler.py``). The data order is a pure function of
(seed, epoch, position), and ``last.pt`` is written only between optimiser steps, so a resumed run
continues exactly as if it had never stopped.
"""
from __future__ import annotations

import dataclasses
import math
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
import yaml
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from longrange.errors import CheckpointError, ConfigError, TrainingDivergedError
from longrange.objectives.base import add_sums
from longrange.train import distributed as D
from longrange.train.checkpoint import (
    atomic_write,
    load_checkpoint,
    load_model_weights,
    load_weights,
    rng_state,
    save_checkpoint,
    save_safetensors,
    set_rng_state,
)
from longrange.train.config import TrainConfig
from longrange.train.logging import MetricsLogger, truncate_metrics
from longrange.train.rundir import RunLock, RunPaths, check_out_dir, check_same_run, fingerprint
from longrange.train.optim import build_optimizer, group_report
from longrange.train.sampler import ShardedBatchSampler, eval_shards
from longrange.train.schedules import build_schedule


def move_to(batch: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """The batch with its tensors on ``device``."""
    return {k: v.to(device, non_blocking=True) if isinstance(v, Tensor) else v for k, v in batch.items()}


def _plain(value: Any, where: str) -> Any:
    """``value`` as YAML-safe plain data (tuples become lists, paths strings)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, str):
        return str(value)  # also str subclasses (e.g. torch's version string), which YAML cannot write
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise ConfigError(f"config value {where} of type {type(value).__name__} cannot be saved to YAML")


def _seed_worker(worker_id: int) -> None:
    # torch seeds each worker's torch and python generators; numpy needs it done by hand.
    np.random.seed(torch.initial_seed() % 2**32)


def _derived_seed(*parts: int) -> int:
    return int(np.random.default_rng(list(parts)).integers(2**62))


@dataclass
class TrainerState:
    """The progress of a run: saved whole in ``last.pt`` and restored whole on resume, so a resumed
    run cannot forget a field."""

    step: int = 0
    epoch: int = 0
    #: Global batches consumed in ``epoch``.
    batches_done: int = 0
    data_seed: int = 0
    best_value: float | None = None
    best_step: int = -1
    best_metrics: dict[str, float] = field(default_factory=dict)
    bad_evals: int = 0
    stopped_early: bool = False
    #: The objective's sums since the last train log line (tensors).
    train_sums: dict[str, Any] = field(default_factory=dict)
    #: Sum of step losses (a tensor between logs: no device sync per step) and steps since the last log.
    loss_sum: Any = 0.0
    loss_steps: int = 0
    last_lr: float = 0.0
    #: Seconds of training in this and earlier (resumed) segments, up to the last checkpoint.
    elapsed: float = 0.0
    history: list[dict[str, Any]] = field(default_factory=list)
    final_val: dict[str, float] = field(default_factory=dict)
    #: Lines in metrics.jsonl at the checkpoint (later lines are dropped on resume).
    metrics_lines: int = 0

    def to_checkpoint(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["train_sums"] = {k: v.detach().to("cpu") if isinstance(v, Tensor) else v for k, v in self.train_sums.items()}
        out["loss_sum"] = float(self.loss_sum)
        return out

    @classmethod
    def from_checkpoint(cls, data: Mapping[str, Any], source: object) -> "TrainerState":
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, Mapping) or set(data) != names:
            raise CheckpointError(
                f"{source} was written by another version of the trainer (its state fields differ); "
                "start afresh with --overwrite"
            )
        return cls(**dict(data))


class Trainer:
    """Trains ``model`` with ``objective`` on ``train_set``, selecting by ``objective.metric``.

    Args:
        model: any ``nn.Module`` the objective knows how to call.
        objective: ``objective(model, batch) -> StepOutput``; ``objective.summarize(sums)``;
            ``objective.metric`` and ``objective.higher_is_better`` select the best checkpoint.
            In distributed training the objective receives the DDP wrapper and must call the
            model's ``forward`` (``model(...)``), not other methods, for gradients to synchronise.
        train_set, val_set, test_set: datasets of items in the format of ``data/batch.py``.
            ``val_set`` may be None (no selection: best = last); ``train_set.set_epoch(epoch)`` is
            called at each epoch start when it exists.
        collate: list of items -> batch dict.
        cfg: a :class:`TrainConfig` or a dict for :meth:`TrainConfig.from_dict`.
        run_dir: directory of the run (created).
        device: default ``cuda:LOCAL_RANK`` if CUDA is available, else the CPU.
        extra_config: saved in ``config.yaml`` beside the train config (e.g. model and task). Its
            identity (see ``train/rundir.py``) must match the saved one to resume.
        resume: continue exactly from ``run_dir/checkpoints/last.pt``.
        overwrite: start afresh in a run directory that already holds a run (its metrics,
            checkpoints and TensorBoard events are deleted). Without it, that is an error.
        tensorboard: also write TensorBoard events when the package is installed.
        lock: lock the run directory while training (a second writer stops at once); pass a held
            :class:`~longrange.train.rundir.RunLock` when the caller already holds it.

    Construction seeds python, numpy and torch with ``cfg.seed + rank`` (the stream used by dropout
    and random masking; build and initialise the model before). ``fit`` leaves the model holding
    the best weights.
    """

    def __init__(
        self,
        model: nn.Module,
        objective: Any,
        train_set: Dataset,
        val_set: Dataset | None,
        collate: Callable[[Sequence[dict]], dict[str, Tensor]],
        cfg: TrainConfig | Mapping[str, Any],
        run_dir: str | Path,
        test_set: Dataset | None = None,
        device: torch.device | str | None = None,
        *,
        extra_config: Mapping[str, Any] | None = None,
        resume: bool = False,
        overwrite: bool = False,
        tensorboard: bool = True,
        lock: bool | RunLock = True,
    ):
        self.cfg = cfg = TrainConfig.from_dict(cfg) if isinstance(cfg, Mapping) else cfg
        cfg.validate()
        if resume and overwrite:
            raise ConfigError("--resume and --overwrite contradict each other: resume a run, or replace it")
        self.objective = objective
        self.train_set, self.val_set, self.test_set = train_set, val_set, test_set
        self.collate = collate
        self.paths = RunPaths(check_out_dir(run_dir))
        self._check_objective()
        self._check_datasets()
        self.env = D.init_distributed(device)
        self.device = self.env.device
        self.is_main = self.env.is_main
        self._check_precision()
        self._plan_length()
        self._seed_streams()
        self._build_optimisation(model)
        self.state = TrainerState(data_seed=cfg.seed, last_lr=cfg.lr * self.schedule.multiplier(0))
        self._best_weights: dict[str, Tensor] | None = None
        self._segment_start = time.time()
        self._elapsed_before = 0.0  # seconds of the segments before this one (from last.pt)
        #: Called as ``on_checkpoint(step, path)`` after ``last.pt`` is written (tests use it).
        self.on_checkpoint: Callable[[int, Path], None] | None = None

        self.lock = self._lock_run_dir(lock)
        try:
            config = self._resolved_config(extra_config, resume)
            self._prepare_run_dir(resume, overwrite, config)
            if resume:
                self._resume()
            self.logger = MetricsLogger(self.paths.root, enabled=self.is_main, tensorboard=tensorboard)
            if self.is_main:
                text = yaml.safe_dump(config, sort_keys=False).encode()
                atomic_write(self.paths.config, lambda f: f.write(text))
        except BaseException:
            self.close()
            raise
        self.train_model = D.wrap_model(self.model, self.device, cfg.find_unused_parameters)
        self._progress = Progress(self)

    # ------------------------------------------------------------------ construction steps
    def _check_objective(self) -> None:
        for attr in ("metric", "higher_is_better", "summarize"):
            if not hasattr(self.objective, attr):
                raise ConfigError(f"the objective {type(self.objective).__name__} has no '{attr}' (see objectives/base.py)")

    def _check_datasets(self) -> None:
        for split, ds in (("train", self.train_set), ("val", self.val_set), ("test", self.test_set)):
            if ds is not None and not hasattr(ds, "__len__"):
                raise ConfigError(
                    f"the {split} set ({type(ds).__name__}) has no length: the trainer needs map-style datasets "
                    "(with __len__ and __getitem__) to derive a resumable batch order"
                )

    def _check_precision(self) -> None:
        if self.cfg.precision == "fp16" and self.device.type != "cuda":
            raise ConfigError(
                f"train.precision 'fp16' needs a CUDA device (it uses a GradScaler); this run is on "
                f"{self.device.type}: use 'bf16' or 'fp32'"
            )

    def _plan_length(self) -> None:
        cfg = self.cfg
        self.micro_batch = cfg.micro_batch(self.env.world_size)
        self.steps_per_epoch = len(self.train_set) // cfg.batch_size
        if self.steps_per_epoch == 0:
            raise ConfigError(
                f"train.batch_size {cfg.batch_size} is larger than the training set ({len(self.train_set)} items): "
                "no complete batch"
            )
        self.total_steps = cfg.max_steps if cfg.max_steps > 0 else cfg.epochs * self.steps_per_epoch

    def _seed_streams(self) -> None:
        # The training RNG stream (dropout, masking) differs per rank, else all ranks drop alike.
        seed = self.cfg.seed + self.env.rank
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)

    def _build_optimisation(self, model: nn.Module) -> None:
        cfg = self.cfg
        self.model = model.to(self.device)
        self.optimizer = build_optimizer(self.model, cfg)
        self.param_report = group_report(self.optimizer.param_groups)
        self.schedule = build_schedule(
            cfg, self.total_steps, higher_is_better=self.objective.higher_is_better, steps_per_epoch=self.steps_per_epoch
        )
        self.scaler = torch.amp.GradScaler(self.device.type) if cfg.precision == "fp16" else None

    def _lock_run_dir(self, lock: bool | RunLock) -> RunLock | None:
        self._owns_lock = False
        if isinstance(lock, RunLock):
            return lock  # held by the caller, who releases it
        if not lock or not self.is_main:
            return None
        self._owns_lock = True
        return RunLock(self.paths.root).acquire()

    def _resolved_config(self, extra: Mapping[str, Any] | None, resume: bool) -> dict[str, Any]:
        if resume and extra is None and self.paths.config.is_file():
            # Keep what the original run saved beside the train config (model, task, ...).
            saved = yaml.safe_load(self.paths.config.read_text()) or {}
            extra = {k: v for k, v in saved.items() if k not in ("train", "fingerprint")}
        out = _plain(dict(extra or {}), "extra_config")
        out["train"] = self.cfg.to_dict()
        out["fingerprint"] = fingerprint(out)
        return out

    def _prepare_run_dir(self, resume: bool, overwrite: bool, config: Mapping[str, Any]) -> None:
        p = self.paths
        if resume:
            if not p.last.is_file():
                raise CheckpointError(f"cannot resume: no checkpoint at {p.last}")
            check_same_run(p.root, config, "resume")
            return
        existing = [f for f in (p.last, p.best_weights, p.metrics, p.summary) if f.exists()]
        if existing and not overwrite:
            raise ConfigError(
                f"run directory {p.root} already holds a run ({existing[0].name}); pass --resume to continue it, "
                "--overwrite to replace it, or choose a new --out"
            )
        D.barrier()  # every rank has looked before rank 0 deletes
        if self.is_main:
            for f in (p.last, p.checkpoints / "best.pt", p.best_weights, p.metrics, p.summary):
                f.unlink(missing_ok=True)
            if p.tensorboard.is_dir():
                for f in p.tensorboard.glob("events.out.tfevents.*"):
                    f.unlink()
            p.checkpoints.mkdir(parents=True, exist_ok=True)
        D.barrier()

    def close(self) -> None:
        """Release the run directory's lock if this trainer took it (``fit`` does this when it ends)."""
        if self.lock is not None and getattr(self, "_owns_lock", False):
            self.lock.release()

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint_state(self) -> dict[str, Any]:
        """The run's state. A collective: every rank must call it (RNG states are gathered)."""
        rng = D.gather_objects(rng_state())
        self.state.elapsed = self._elapsed()
        self.state.metrics_lines = self.logger.lines if self.is_main else 0
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "rng": rng,
            "trainer": self.state.to_checkpoint(),
            "data": {"batch_size": self.cfg.batch_size, "n_items": len(self.train_set)},
            "config": self.cfg.to_dict(),
            "world_size": self.env.world_size,
        }

    def _check_finite_parameters(self) -> None:
        bad = [n for n, p in self.model.named_parameters() if not torch.isfinite(p).all()]
        if bad:
            self._diverged(f"parameter(s) {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''} became non-finite")

    def _diverged(self, what: str) -> None:
        last = ""
        if self.paths.last.is_file():
            last = f"; the last good checkpoint is {self.paths.last}"
        raise TrainingDivergedError(
            f"training diverged at step {self.state.step} of {self.total_steps}: {what}{last}. "
            "Lower train.lr, set train.grad_clip, or check the data; the run is not a result"
        )

    def _save(self, best: bool) -> None:
        self._check_finite_parameters()  # last.pt always holds finite weights
        state = self._checkpoint_state()
        if self.is_main:
            if best:
                save_safetensors(state["model"], self.paths.best_weights)
            save_checkpoint(state, self.paths.last)
            if self.lock is not None:
                self.lock.heartbeat(every=0)
        D.barrier()
        if self.on_checkpoint is not None:
            self.on_checkpoint(self.state.step, self.paths.last)

    def _resume(self) -> None:
        ckpt = load_checkpoint(self.paths.last, map_location=self.device)
        if "trainer" not in ckpt:
            raise CheckpointError(
                f"{self.paths.last} was written by an older version of longrange and cannot be resumed; "
                "start afresh with --overwrite"
            )
        data = ckpt["data"]
        if data["batch_size"] != self.cfg.batch_size or data["n_items"] != len(self.train_set):
            raise ConfigError(
                f"cannot resume {self.paths.last}: it was trained with train.batch_size {data['batch_size']} on "
                f"{data['n_items']} items, this run has {self.cfg.batch_size} on {len(self.train_set)}"
            )
        load_model_weights(self.model, ckpt["model"], source=self.paths.last)
        try:
            self.optimizer.load_state_dict(ckpt["optimizer"])
        except ValueError as err:
            raise CheckpointError(f"the optimiser state in {self.paths.last} does not fit the model: {err}") from None
        self.schedule.load_state_dict(ckpt["schedule"])
        if self.scaler is not None and ckpt["scaler"] is not None:
            self.scaler.load_state_dict(ckpt["scaler"])
        self.state = TrainerState.from_checkpoint(ckpt["trainer"], self.paths.last)
        self._elapsed_before = self.state.elapsed
        rng = ckpt["rng"]
        if len(rng) == self.env.world_size:
            set_rng_state(rng[self.env.rank])
        else:  # another number of ranks: data order stays exact, random streams restart
            torch.manual_seed(_derived_seed(self.cfg.seed, self.state.step, self.env.rank))
        if self.paths.best_weights.is_file():
            self._best_weights = load_weights(self.paths.best_weights)
        if self.is_main:  # drop records written after the checkpoint: they will be written again
            truncate_metrics(self.paths.metrics, self.state.metrics_lines)

    # ------------------------------------------------------------------ data
    def _autocast(self):
        if self.cfg.precision == "fp32":
            return nullcontext()
        dtype = torch.bfloat16 if self.cfg.precision == "bf16" else torch.float16
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def _loader(self, dataset: Dataset, batch_sampler: Any, generator_seed: int) -> DataLoader:
        # A private generator: creating the loader must not draw from the global RNG, whose
        # stream belongs to the model (dropout) and must continue exactly across a resume.
        return DataLoader(
            dataset,
            batch_sampler=batch_sampler,
            collate_fn=self.collate,
            num_workers=self.cfg.num_workers,
            pin_memory=self.device.type == "cuda",
            worker_init_fn=_seed_worker if self.cfg.num_workers else None,
            generator=torch.Generator().manual_seed(generator_seed),
        )

    def _global_batches(self) -> Iterator[list[dict[str, Any]]]:
        """The micro-batches of each optimiser step, from the current data position onwards."""
        st = self.state
        while True:
            if st.batches_done >= self.steps_per_epoch:
                st.epoch += 1
                st.batches_done = 0
            if hasattr(self.train_set, "set_epoch"):
                self.train_set.set_epoch(st.epoch)
            sampler = ShardedBatchSampler(
                len(self.train_set), self.cfg.batch_size, st.data_seed, st.epoch,
                rank=self.env.rank, world_size=self.env.world_size, grad_accum=self.cfg.grad_accum,
                start_batch=st.batches_done,
            )
            seed = _derived_seed(st.data_seed, st.epoch, st.batches_done, self.env.rank)
            group: list[dict[str, Any]] = []
            for batch in self._loader(self.train_set, sampler, seed):
                group.append(batch)
                if len(group) == self.cfg.grad_accum:
                    yield group
                    group = []

    # ------------------------------------------------------------------ one step
    def _train_step(self, micro_batches: list[dict[str, Any]]) -> None:
        st = self.state
        self.train_model.train()
        lr_mult = self.schedule.multiplier(st.step)
        for group in self.optimizer.param_groups:
            group["lr"] = group["peak_lr"] * lr_mult
        st.last_lr = self.cfg.lr * lr_mult
        n = len(micro_batches)
        step_loss = 0.0
        for i, batch in enumerate(micro_batches):
            batch = move_to(batch, self.device)
            # DDP all-reduces gradients in backward; only the last micro-batch needs it.
            sync = nullcontext() if i == n - 1 or not self.env.distributed else self.train_model.no_sync()
            with sync:
                with self._autocast():
                    out = self.objective(self.train_model, batch)
                loss = out.loss / n
                (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            step_loss += loss.detach()
            st.train_sums = add_sums(st.train_sums or None, out.sums)
        if self.cfg.grad_clip > 0:
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        st.loss_sum = st.loss_sum + step_loss  # a tensor: no device sync per step
        st.loss_steps += 1
        st.step += 1
        st.batches_done += 1

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, dataset: Dataset, split: str = "val") -> dict[str, float]:
        """Metrics of ``dataset`` (all ranks' sums added), in eval mode without gradients."""
        if self.env.distributed:  # every rank evaluates rank 0's buffers (e.g. norm statistics)
            for buf in self.model.buffers():
                torch.distributed.broadcast(buf, src=0)
        was_training = self.model.training
        self.model.eval()
        batch = self.cfg.eval_batch_size or self.micro_batch
        shards = eval_shards(len(dataset), batch, self.env.rank, self.env.world_size)
        sums: dict[str, Tensor] | None = None
        try:
            for b in self._loader(dataset, shards, generator_seed=0):
                with self._autocast():
                    out = self.objective(self.model, move_to(b, self.device))
                sums = add_sums(sums, out.sums)
        finally:
            self.model.train(was_training)
        total = D.all_reduce_sums(sums, self.device)
        if not total:
            raise ValueError(f"the objective returned no sums on the {split} set ({len(dataset)} items)")
        return {k: float(v) for k, v in self.objective.summarize(total).items()}

    def _better(self, value: float, than: float | None) -> bool:
        if math.isnan(value):
            return False
        if than is None:
            return True
        return value > than if self.objective.higher_is_better else value < than

    def _elapsed(self) -> float:
        """Seconds of training: earlier (resumed) segments plus this one."""
        return self._elapsed_before + time.time() - self._segment_start

    def _log(self, split: str, metrics: Mapping[str, float]) -> None:
        epoch = self.state.epoch + self.state.batches_done / self.steps_per_epoch
        self.logger.log(self.state.step, epoch, split, metrics, self.state.last_lr, self._elapsed())

    def _log_train(self) -> dict[str, float]:
        st = self.state
        sums = D.all_reduce_sums(st.train_sums or None, self.device)
        loss = torch.tensor([float(st.loss_sum), float(st.loss_steps)], dtype=torch.float64, device=self.device)
        if self.env.distributed:
            torch.distributed.all_reduce(loss)
            loss[0] /= self.env.world_size  # every rank counted every step
            loss[1] /= self.env.world_size
        metrics = {k: float(v) for k, v in self.objective.summarize(sums).items()} if sums else {}
        metrics.setdefault("loss", float(loss[0] / max(loss[1], 1.0)))
        if not math.isfinite(metrics["loss"]):
            self._diverged(f"the training loss is {metrics['loss']} (mean over the last {st.loss_steps} steps)")
        self._log("train", metrics)
        st.train_sums, st.loss_sum, st.loss_steps = {}, 0.0, 0
        if self.lock is not None:
            self.lock.heartbeat()
        return metrics

    def _validate(self) -> bool:
        """Evaluate on the validation set, track the best; True when it improved."""
        st = self.state
        metrics = self.evaluate(self.val_set, "val")
        if self.objective.metric not in metrics:
            raise ConfigError(
                f"the selection metric {self.objective.metric!r} is not among the validation metrics "
                f"{sorted(metrics)}"
            )
        self._log("val", metrics)
        self._progress.validated(metrics)
        st.final_val = metrics
        value = metrics[self.objective.metric]
        if not math.isfinite(value):
            self._diverged(f"the validation {self.objective.metric} is {value}")
        st.history.append({"step": st.step, "metrics": metrics})
        self.schedule.observe(value)
        if self._better(value, st.best_value):
            st.best_value, st.best_step, st.best_metrics = value, st.step, metrics
            st.bad_evals = 0
            self._keep_best_weights()
            return True
        st.bad_evals += 1
        if self.cfg.patience and st.bad_evals >= self.cfg.patience:
            st.stopped_early = True
        return False

    def _keep_best_weights(self) -> None:
        self._best_weights = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, Any]:
        """Train to the end (or early stop), then evaluate the best weights on the test set.

        Leaves the model holding the best weights (the last ones when there is no validation set).
        Returns ``{"metric", "best": {"step", "value", "metrics"}, "final", "test", "step",
        "epochs", "stopped_early", "param_groups", "seconds"}``.
        """
        self._segment_start = time.time()
        try:
            self._progress.start()
            self._train_until_done()
            return self._finish()
        finally:
            self._progress.close()
            self.close()

    def _train_until_done(self) -> None:
        st = self.state
        if st.step >= self.total_steps or st.stopped_early:
            return
        for micro_batches in self._global_batches():
            self._train_step(micro_batches)
            if self._after_step():
                break

    def _after_step(self) -> bool:
        """Log, evaluate and checkpoint as configured after a step; True when training is over."""
        cfg, st = self.cfg, self.state
        done = st.step >= self.total_steps
        if st.step % cfg.log_every == 0 or done:
            self._progress.trained(self._log_train())
        else:
            self._progress.trained(None)
        epoch_end = st.batches_done == self.steps_per_epoch
        evaluate = self.val_set is not None and (
            done or (cfg.eval_every == 0 and epoch_end) or (cfg.eval_every > 0 and st.step % cfg.eval_every == 0)
        )
        improved = self._validate() if evaluate else False
        over = done or st.stopped_early
        if evaluate or over or (cfg.checkpoint_every and st.step % cfg.checkpoint_every == 0):
            if self.val_set is None and over:
                improved = True  # no selection: the final weights are the best
                st.best_step = st.step
                self._keep_best_weights()
            self._save(best=improved)
        return over

    def _finish(self) -> dict[str, Any]:
        st = self.state
        test_metrics = None
        if self._best_weights is not None:
            self.model.load_state_dict(self._best_weights)
        if self.test_set is not None:
            test_metrics = self.evaluate(self.test_set, "test")
            self._log("test", test_metrics)
        self.logger.close()
        return {
            "metric": self.objective.metric,
            "best": {"step": st.best_step, "value": st.best_value, "metrics": dict(st.best_metrics)},
            "final": dict(st.final_val),
            "test": test_metrics,
            "step": st.step,
            "epochs": st.epoch + st.batches_done / self.steps_per_epoch,
            "stopped_early": st.stopped_early,
            "param_groups": self.param_report,
            "seconds": self._elapsed(),
        }


class Progress:
    """What a person watching the run sees on stderr (rank 0 only).

    On a terminal: a progress bar with the loss and lr. Elsewhere (nohup, SLURM, ``> log``): a plain
    line every ``train.progress_every`` seconds with step/total, loss, lr, the last validation metric
    and the ETA. Validation metrics are printed after each evaluation in both cases.
    """

    def __init__(self, trainer: Trainer):
        self.t = trainer
        self.enabled = trainer.is_main and trainer.cfg.progress
        self.tty = self.enabled and sys.stderr.isatty()
        self.bar = None
        self.loss: float | None = None
        self.val: str = ""
        self._last_line = 0.0
        self._start_step = 0
        self._start = 0.0

    def start(self) -> None:
        self._start_step, self._start = self.t.state.step, time.time()
        self._last_line = self._start
        if self.tty:
            from tqdm import tqdm

            self.bar = tqdm(total=self.t.total_steps, initial=self.t.state.step, desc="train", dynamic_ncols=True)

    def trained(self, metrics: Mapping[str, float] | None) -> None:
        if not self.enabled:
            return
        if metrics is not None:
            self.loss = metrics["loss"]
        if self.bar is not None:
            self.bar.update(1)
            if metrics is not None:
                self.bar.set_postfix(loss=f"{self.loss:.4g}", lr=f"{self.t.state.last_lr:.3g}")
            return
        now = time.time()
        if now - self._last_line >= self.t.cfg.progress_every:
            self._last_line = now
            print(self.line(now), file=sys.stderr, flush=True)

    def line(self, now: float) -> str:
        st, total = self.t.state, self.t.total_steps
        rate = (st.step - self._start_step) / max(now - self._start, 1e-9)
        eta = (total - st.step) / rate if rate > 0 else float("inf")
        loss = f"{self.loss:.4g}" if self.loss is not None else "-"
        return (f"step {st.step}/{total} ({100 * st.step / total:.0f}%)  loss {loss}  lr {st.last_lr:.3g}"
                f"{'  ' + self.val if self.val else ''}  eta {format_seconds(eta)}")

    def validated(self, metrics: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        metric = self.t.objective.metric
        shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())
        self.val = f"val {metric} {metrics.get(metric, float('nan')):.4g}"
        text = f"step {self.t.state.step}/{self.t.total_steps}: val {shown}"
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def format_seconds(seconds: float) -> str:
    """``1h02m``, ``3m05s``, ``12s``; ``?`` when unknown."""
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"



# ---------------------------------------------------------------------- entry point
def _splits(data: Any) -> tuple[Dataset, Dataset | None, Dataset | None]:
    if isinstance(data, Mapping):
        unknown = set(data) - {"train", "val", "test"}
        if unknown or "train" not in data:
            raise ConfigError(
                f"training data must map 'train' (and optionally 'val', 'test') to datasets, got keys {sorted(data)}"
            )
        return data["train"], data.get("val"), data.get("test")
    if isinstance(data, (list, tuple)):
        if not 1 <= len(data) <= 3:
            raise ConfigError(f"training data as a sequence must be (train[, val[, test]]), got {len(data)} items")
        parts = list(data) + [None] * (3 - len(data))
        return parts[0], parts[1], parts[2]
    if hasattr(data, "train"):
        return data.train, getattr(data, "val", None), getattr(data, "test", None)
    raise ConfigError(f"cannot find train/val/test datasets in a {type(data).__name__}")


def train(
    model: nn.Module,
    objective: Any,
    data: Any,
    cfg: TrainConfig | Mapping[str, Any],
    run_dir: str | Path,
    *,
    collate: Callable[[Sequence[dict]], dict[str, Tensor]] | None = None,
    extra_config: Mapping[str, Any] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    device: torch.device | str | None = None,
    evaluate_test: bool = True,
    tensorboard: bool = True,
    lock: bool | RunLock = True,
) -> dict[str, Any]:
    """Train ``model`` on ``data`` and return :meth:`Trainer.fit`'s summary.

    ``data`` is a task's loaded data (anything with ``train``/``val``/``test`` attributes, e.g.
    ``longrange.data.tasks.TaskData``), a dict with those keys, or a tuple (train, val, test).
    ``collate`` defaults to ``data.collate`` when present, else :func:`longrange.data.batch.collate`.
    Under ``torchrun`` this joins the process group and leaves it at the end.
    """
    train_set, val_set, test_set = _splits(data)
    if collate is None:
        collate = getattr(data, "collate", None)
        if collate is None:
            from longrange.data.batch import collate
    trainer = Trainer(
        model, objective, train_set, val_set, collate, cfg, run_dir,
        test_set=test_set if evaluate_test else None, device=device,
        extra_config=extra_config, resume=resume, overwrite=overwrite, tensorboard=tensorboard, lock=lock,
    )
    try:
        return trainer.fit()
    finally:
        trainer.close()
        D.cleanup(trainer.env)
