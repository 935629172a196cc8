"""The training loop: plain PyTorch, readable top to bottom.

    trainer = Trainer(model, objective, train_set, val_set, collate, cfg, run_dir, test_set=test_set)
    result = trainer.fit()           # a FitResult: result["best"], result["test"], ...

``fit`` is one loop: a step, then maybe a log line, maybe an evaluation, maybe a checkpoint. Its
parts are components in modules of their own, each with a narrow interface (the table is in
``longrange/train/__init__.py``).

A non-finite training loss, validation metric or parameter stops the run with a
:class:`~longrange.errors.TrainingDivergedError` naming the step and the last good checkpoint
(``last.pt`` only ever holds finite weights). ``last.pt`` is written only between optimiser steps and
the data order is a pure function of (seed, epoch, position), so a resumed run continues exactly as
if it had never stopped.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from longrange.errors import CheckpointError, ConfigError, DiskWriteError, Preempted, TrainingDivergedError
from longrange.faults import kill_point
from longrange.objectives.base import check_objective
from longrange.train import distributed as D
from longrange.train.allocator import keep_freed_memory
from longrange.train.checkpoint import Checkpointer, load_model_weights, rng_state, set_rng_state
from longrange.train.compile import Compilation
from longrange.train.config import TrainConfig
from longrange.train.denormals import flush_denormals
from longrange.train.environment import (
    KernelRecord,
    describe_device,
    describe_precision,
    merge_denormals,
    prepare_deterministic,
    set_deterministic,
)
from longrange.train.evaluation import Evaluator, move_to
from longrange.train.logging import open_logger, truncate_metrics
from longrange.train.meter import MetricMeter
from longrange.train.optim import build_optimizer, group_report
from longrange.train.precision import Precision
from longrange.train.preemption import StopOnSignal
from longrange.train.progress import Progress
from longrange.train.rundir import Intent, OpenRun, RunDir, check_out_dir, plain
from longrange.train.sampler import BatchPlan, check_map_style, derived_seed
from longrange.train.schedules import build_schedule
from longrange.train.selection import BestSelector
from longrange.train.state import LATER_FIELDS, STATE_FIELDS, TrainState
from longrange.train.step import training_step

__all__ = ["BestPoint", "FitResult", "Trainer"]


class BestPoint(TypedDict):
    """The best validation point: its step, the selection metric's value there and every metric."""

    step: int
    value: float | None
    metrics: dict[str, float]


class FitResult(TypedDict):
    """What :meth:`Trainer.fit` returns: the run's result, before the experiment layer records it
    (``experiment/record.stage_summary`` makes ``summary.json`` of it)."""

    #: The selection metric's name, and the best validation point (the last, without validation).
    metric: str
    best: BestPoint
    #: The metrics of the last validation, and of the test set with the best weights (None: not tested).
    final: dict[str, float]
    test: dict[str, float] | None
    #: Optimiser steps done, epochs (fractional), whether early stopping ended the run.
    step: int
    epochs: float
    stopped_early: bool
    #: Per optimiser parameter group (``optim.group_report``), and seconds of training, resumes
    #: included: wall time, and the training process's CPU time (None where a resumed segment's is
    #: unknown; see ``TrainState.cpu_seconds``).
    param_groups: dict[str, dict[str, Any]]
    seconds: float
    cpu_seconds: float | None
    #: Where it ran and how (``train/environment.py``): device, precision, deterministic mode, the
    #: implementation each op ran.
    device: dict[str, Any]
    precision: dict[str, Any]
    deterministic: bool
    kernels: dict[str, str]


class Trainer:
    """Trains ``model`` with ``objective`` on ``train_set``, selecting by ``objective.metric``.

    Args:
        model: any ``nn.Module`` the objective knows how to call.
        objective: ``objective(model, batch) -> StepOutput``; ``objective.summarize(sums)``;
            ``objective.metric`` and ``objective.higher_is_better`` select the best checkpoint.
            In distributed training the objective receives the DDP wrapper and must call the
            model's ``forward`` (``model(...)``), not other methods, for gradients to synchronise.
        train_set, val_set, test_set: map-style datasets of items in the format of ``data/batch.py``.
            ``val_set`` may be None (no selection: best = last); ``train_set.set_epoch(epoch)`` is
            called at each epoch start when it exists.
        collate: list of items -> batch dict.
        cfg: a :class:`TrainConfig` or a dict for :meth:`TrainConfig.from_dict`.
        run_dir: the run directory: a path (opened here, with ``resume``/``overwrite`` as the
            command line's flags), or an :class:`~longrange.train.rundir.OpenRun` that the caller
            opened and decided (it keeps the lock and closes it).
        device: default ``cuda:LOCAL_RANK`` if CUDA is available, else the CPU.
        extra_config: saved in ``config.yaml`` beside the train config (e.g. model and task). Its
            identity (see ``train/rundir/decide.py``) must match the saved one to resume.
        resume, overwrite: continue the run in ``run_dir`` from its last checkpoint, or replace it.
        tensorboard: False leaves TensorBoard out even when ``cfg.loggers`` names it.
        run_name, run_group: the run's name and group in W&B (``cfg.loggers``); default name: the
            run directory's name; ``cfg.wandb.group`` wins over ``run_group``.

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
        run_dir: str | Path | OpenRun,
        test_set: Dataset | None = None,
        device: torch.device | str | None = None,
        *,
        extra_config: Mapping[str, Any] | None = None,
        resume: bool = False,
        overwrite: bool = False,
        tensorboard: bool = True,
        run_name: str | None = None,
        run_group: str | None = None,
    ):
        self.cfg = cfg = TrainConfig.from_dict(cfg) if isinstance(cfg, Mapping) else cfg
        cfg.validate()
        prepare_deterministic(cfg.deterministic)  # before any CUDA work
        intent = Intent.from_flags(resume, overwrite)
        self.objective, self.train_set, self.val_set, self.test_set = objective, train_set, val_set, test_set
        opened = isinstance(run_dir, OpenRun)
        run = run_dir.dir if opened else RunDir(check_out_dir(run_dir))
        check_objective(objective)
        check_map_style(train=train_set, val=val_set, test=test_set)
        self.env = D.init_distributed(device)
        self.device, self.is_main = self.env.device, self.env.is_main
        if self.device.type == "cpu":
            keep_freed_memory()  # a step's freed temporaries reused by the next (train/allocator.py)
        self.precision = Precision(cfg.precision, self.device)
        self.compilation = Compilation(cfg.compile, self.device)
        self.micro_batch = cfg.micro_batch(self.env.world_size)
        self.batches = BatchPlan(
            train_set,
            collate,
            batch_size=cfg.batch_size,
            grad_accum=cfg.grad_accum,
            rank=self.env.rank,
            world_size=self.env.world_size,
            num_workers=cfg.num_workers,
            pin_memory=self.device.type == "cuda",
        )
        self.steps_per_epoch = self.batches.steps_per_epoch
        self.evaluator = Evaluator(
            objective,
            self.precision,
            self.batches.loader,
            self.env,
            cfg.eval_batch_size or self.micro_batch,
            cfg.eval_every,
        )
        self.total_steps = cfg.max_steps if cfg.max_steps > 0 else cfg.epochs * self.steps_per_epoch
        seed = cfg.seed + self.env.rank  # dropout and masking differ per rank, else all ranks drop alike
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        self.model = model.to(self.device)
        #: Where and how the run trains (its record; fit returns it with the deterministic mode and kernels).
        self.environment = {
            "device": describe_device(self.device, self.env.world_size),
            "precision": describe_precision(self.precision.dtype, self.model),
        }
        self.kernels = KernelRecord()
        self._logger_state: Mapping[str, Any] | None = None
        self.optimizer = build_optimizer(self.model, cfg)
        self.param_report = group_report(self.optimizer.param_groups)
        self.schedule = build_schedule(
            cfg, self.total_steps, higher_is_better=objective.higher_is_better, steps_per_epoch=self.steps_per_epoch
        )
        self.state = TrainState(data_seed=cfg.seed, last_lr=cfg.lr * self.schedule.multiplier(0))
        self.meter = MetricMeter()
        self.selector = BestSelector(objective.metric, objective.higher_is_better, cfg.patience)
        self.progress = Progress(self.is_main and cfg.progress, self.total_steps, objective.metric, cfg.progress_every)
        self._segment_start, self._elapsed_before = time.time(), 0.0
        self._segment_cpu_start, self._cpu_before = time.process_time(), 0.0
        #: Called as ``on_checkpoint(step, path)`` after ``last.pt`` is written (tests use it).
        self.on_checkpoint: Callable[[int, Path], None] | None = None

        config = self._config(run, extra_config, intent)
        self._owns_run = not opened
        self.run = run_dir if opened else run.open(config, intent)
        self.checkpointer = Checkpointer(run)
        try:
            if self.run.resumes:
                self._resume()
            tracked = {**config, "record": {**(config.get("record") or {}), **self.environment}}
            self.logger = open_logger(
                run,
                cfg,
                enabled=self.is_main,
                tensorboard=tensorboard,
                name=run_name or run.root.name,
                group=run_group,
                config=tracked,
                state=self._logger_state,
            )
            if self.is_main:
                run.write_config(config)
        except BaseException:
            self.close()
            raise
        # Compiled in place, so the state dict's keys stay those of the eager model.
        self.train_model = D.wrap_model(self.compilation.apply(self.model), self.device, cfg.find_unused_parameters)

    def _config(self, run: RunDir, extra: Mapping[str, Any] | None, intent: Intent) -> dict[str, Any]:
        """The resolved configuration saved in config.yaml: ``extra`` and the train config."""
        if intent.mode == "resume" and extra is None:  # keep what the original run saved beside it
            saved = run.read_config() or {}
            extra = {k: v for k, v in saved.items() if k not in ("train", "fingerprint")}
        return {**plain(dict(extra or {}), "extra_config"), "train": self.cfg.to_dict()}

    def close(self) -> None:
        """Close the loggers and release the run directory if this trainer opened it (``fit`` does
        this when it ends)."""
        if getattr(self, "model", None) is not None:
            self.compilation.restore(self.model)  # eager again, as the caller gave it
        if getattr(self, "logger", None) is not None:
            self.logger.close()
        if getattr(self, "_owns_run", False):
            self.run.close()

    # ------------------------------------------------------------------ the loop
    def fit(self) -> FitResult:
        """Train to the end (or early stop), then evaluate the best weights on the test set.

        Leaves the model holding the best weights (the last ones when there is no validation set).
        Returns a :class:`FitResult`.
        """
        self._segment_start = time.time()
        restore_denormals = flush_denormals(self.device)  # subnormals flushed on a CPU (train/denormals.py)
        restore = set_deterministic(self.cfg.deterministic)
        self.kernels.start()
        try:
            self.progress.start(self.state.step)
            if not self._over():
                with StopOnSignal() as stop:
                    for micro_batches in self.batches.steps(self.state):
                        self._step(micro_batches)
                        over = self._after_step()
                        # preemption: checkpoint, then stop; also when the signal came during the last
                        # step, so that the request is never lost (a comparison stops, a resume finishes)
                        if self._stop_requested(stop):
                            if self.checkpointer.step != self.state.step:
                                self._save(best=False)
                            raise Preempted(self.state.step, self.total_steps, signal=stop.signal)
                        if over:
                            break
            return self._finish()
        except DiskWriteError as err:  # a full disk: which file, why, and what is safe
            good = self.checkpointer.last_good().lstrip("; ") or "no checkpoint was written yet"
            raise err.adding(f"training stopped at step {self.state.step} of {self.total_steps}; {good}") from None
        finally:
            restore()
            restore_denormals()
            self.progress.close()
            self.close()

    def _stop_requested(self, stop: StopOnSignal) -> bool:
        """Whether a stop was asked for; under DDP, on any rank (all ranks stop at the same step)."""
        if not self.env.distributed:
            return stop.requested
        flag = torch.tensor([float(stop.requested)], device=self.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    def _over(self) -> bool:
        return self.state.step >= self.total_steps or self.selector.stopped_early

    def _step(self, micro_batches: list[dict[str, Any]]) -> None:
        """One optimiser step over the micro-batches of a global batch."""
        st = self.state
        lr_mult = self.schedule.multiplier(st.step)
        for group in self.optimizer.param_groups:
            group["lr"] = group["peak_lr"] * lr_mult
        st.last_lr = self.cfg.lr * lr_mult
        n = len(micro_batches)

        def sync(i: int):
            # DDP all-reduces gradients in backward; only the last micro-batch needs it.
            return nullcontext() if i == n - 1 or not self.env.distributed else self.train_model.no_sync()

        step_loss = training_step(
            self.train_model,
            self.objective,
            micro_batches,
            self.optimizer,
            self.precision,
            self.cfg.grad_clip,
            prepare=lambda batch: move_to(batch, self.device),
            sync=sync,
            after_micro_batch=lambda out: self.meter.add_batch(out.sums),
            clip_parameters=self.model.parameters(),
        )
        self.meter.add_step(step_loss)
        st.step += 1
        st.batches_done += 1

    def _after_step(self) -> bool:
        """Log, evaluate and save as configured after a step; True when training is over."""
        cfg, st = self.cfg, self.state
        done = st.step >= self.total_steps
        metrics = self._log_train() if st.step % cfg.log_every == 0 or done else None
        self.progress.trained(st.step, st.last_lr, metrics)
        evaluate = self.val_set is not None and self.evaluator.due(
            st.step, st.batches_done == self.steps_per_epoch, done
        )
        improved = self._validate() if evaluate else False
        over = done or self.selector.stopped_early
        if evaluate or over or (cfg.checkpoint_every and st.step % cfg.checkpoint_every == 0):
            if self.val_set is None and over:  # no selection: the final weights are the best
                self.selector.keep(self.model, step=st.step)
                improved = True
            self._save(best=improved)
        return over

    def _finish(self) -> FitResult:
        if self.selector.best_weights is not None:
            self.model.load_state_dict(self.selector.best_weights)
        kill_point("after-checkpoint")
        test_metrics = None
        if self.test_set is not None:
            test_metrics = self.evaluate(self.test_set, "test")
            self._log("test", test_metrics)
            kill_point("after-test-metrics")
        st = self.state
        record = {
            **self.environment,
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "kernels": self.kernels.result(),
        }
        result: FitResult = {
            "metric": self.objective.metric,
            "best": self.selector.result(),
            "final": dict(self.selector.state.final_val),
            "test": test_metrics,
            "step": st.step,
            "epochs": st.epoch + st.batches_done / self.steps_per_epoch,
            "stopped_early": self.selector.stopped_early,
            "param_groups": self.param_report,
            "seconds": self._elapsed(),
            "cpu_seconds": self._cpu_seconds(),
            "device": record["device"],
            "precision": record["precision"],
            "deterministic": record["deterministic"],
            "kernels": record["kernels"],
        }
        self.logger.close(result, record)
        return result

    # ------------------------------------------------------------------ logging and evaluation
    def _elapsed(self) -> float:
        """Seconds of training: earlier (resumed) segments plus this one."""
        return self._elapsed_before + time.time() - self._segment_start

    def _cpu_seconds(self) -> float | None:
        """The process's CPU seconds of training, earlier segments plus this one (None: unknown)."""
        if self._cpu_before is None:
            return None
        return self._cpu_before + time.process_time() - self._segment_cpu_start

    def _log(self, split: str, metrics: Mapping[str, float]) -> None:
        epoch = self.state.epoch + self.state.batches_done / self.steps_per_epoch
        self.logger.log(self.state.step, epoch, split, metrics, self.state.last_lr, self._elapsed())

    def _log_train(self) -> dict[str, float]:
        metrics = self.meter.summary(self.objective, self.device, self.env.world_size)
        if not math.isfinite(metrics["loss"]):
            self._diverged(f"the training loss is {metrics['loss']} (mean over the last {self.meter.steps} steps)")
        self._log("train", metrics)
        self.meter.reset()
        return metrics

    def _validate(self) -> bool:
        """Evaluate on the validation set and select; True when it is the best so far."""
        metrics = self.evaluate(self.val_set, "val")
        metric = self.objective.metric
        if metric not in metrics:
            raise ConfigError(f"the selection metric {metric!r} is not among the validation metrics {sorted(metrics)}")
        self._log("val", metrics)
        self.progress.validated(self.state.step, metrics)
        if not math.isfinite(metrics[metric]):
            self._diverged(f"the validation {metric} is {metrics[metric]}")
        improved = self.selector.observe(self.state.step, metrics)
        self.schedule.observe(metrics[metric])
        if improved:
            self.selector.keep(self.model)
        return improved

    def evaluate(self, dataset: Dataset, split: str = "val") -> dict[str, float]:
        """Metrics of ``dataset`` (all ranks' sums added), in eval mode without gradients."""
        return self.evaluator(self.model, dataset, split)

    def _diverged(self, what: str) -> None:
        raise TrainingDivergedError(
            f"training diverged at step {self.state.step} of {self.total_steps}: {what}{self.checkpointer.last_good()}. "
            "Lower train.lr, set train.grad_clip, or check the data; the run is not a result"
        )

    # ------------------------------------------------------------------ checkpoints
    def _save(self, best: bool) -> None:
        """Write ``last.pt`` (and the best weights). A collective: every rank calls it."""
        bad = [n for n, p in self.model.named_parameters() if not torch.isfinite(p).all()]
        if bad:  # last.pt always holds finite weights
            self._diverged(f"parameter(s) {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''} became non-finite")
        rng = D.gather_objects(rng_state())
        st = self.state
        st.elapsed = self._elapsed()
        st.cpu_seconds = self._cpu_seconds()
        st.metrics_lines = self.logger.lines if self.is_main else 0
        if self.is_main:
            self.checkpointer.save(
                {
                    "model": self.model.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "schedule": self.schedule.state_dict(),
                    "scaler": self.precision.state_dict(),
                    "rng": rng,
                    # The trainer's own state and that of its selector and meter, in one entry.
                    "trainer": {**st.state_dict(), **self.selector.state_dict(), **self.meter.state_dict()},
                    "data": {"batch_size": self.cfg.batch_size, "n_items": len(self.train_set)},
                    "config": self.cfg.to_dict(),
                    "world_size": self.env.world_size,
                    "kernels": self.kernels.state_dict(),
                    "device": self.environment["device"],
                    "loggers": self.logger.state_dict(),
                },
                best=best,
            )
        D.barrier()
        if self.on_checkpoint is not None:
            self.on_checkpoint(st.step, self.run.dir.last)

    def _resume(self) -> None:
        last = self.run.dir.last
        ckpt = self.checkpointer.load(map_location=self.device)
        if "trainer" not in ckpt:
            raise CheckpointError(
                f"{last} was written by an older version of longrange and cannot be resumed; "
                "start afresh with --overwrite"
            )
        data = ckpt["data"]
        if data["batch_size"] != self.cfg.batch_size or data["n_items"] != len(self.train_set):
            raise ConfigError(
                f"cannot resume {last}: it was trained with train.batch_size {data['batch_size']} on "
                f"{data['n_items']} items, this run has {self.cfg.batch_size} on {len(self.train_set)}"
            )
        load_model_weights(self.model, ckpt["model"], source=last)
        try:
            self.optimizer.load_state_dict(ckpt["optimizer"])
        except ValueError as err:
            raise CheckpointError(f"the optimiser state in {last} does not fit the model: {err}") from None
        self.schedule.load_state_dict(ckpt["schedule"])
        self.precision.load_state_dict(ckpt["scaler"])
        saved = ckpt["trainer"]
        expected = {*STATE_FIELDS, *BestSelector.FIELDS, *MetricMeter.FIELDS}
        if not isinstance(saved, Mapping) or not set(saved) <= expected or expected - set(saved) - set(LATER_FIELDS):
            raise CheckpointError(
                f"{last} was written by another version of the trainer (its state fields differ); "
                "start afresh with --overwrite"
            )
        self.state = TrainState(**{k: saved.get(k, LATER_FIELDS.get(k)) for k in STATE_FIELDS})
        self.checkpointer.step = self.state.step
        self.selector.load_state_dict(saved)
        self.meter.load_state_dict(saved)
        self._elapsed_before, self._cpu_before = self.state.elapsed, self.state.cpu_seconds
        rng = ckpt["rng"]
        if len(rng) == self.env.world_size:
            set_rng_state(rng[self.env.rank])
        else:  # another number of ranks: data order stays exact, random streams restart
            torch.manual_seed(derived_seed(self.cfg.seed, self.state.step, self.env.rank))
        self.selector.best_weights = self.checkpointer.load_best()
        self.kernels.load_state_dict(ckpt.get("kernels"))
        self.environment["device"] = merge_denormals(self.environment["device"], ckpt.get("device"))
        self._logger_state = ckpt.get("loggers")
        if self.is_main:  # drop records written after the checkpoint: they will be written again
            truncate_metrics(self.run.dir.metrics, self.state.metrics_lines)
