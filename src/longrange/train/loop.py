"""The training loop: plain PyTorch, readable top to bottom.

    trainer = Trainer(model, objective, train_set, val_set, collate, cfg, run_dir, test_set=test_set)
    summary = trainer.fit()          # {"best": ..., "final": ..., "test": ..., ...}

A run is a directory::

    run_dir/config.yaml              the resolved configuration ({"train": ..., **extra_config})
    run_dir/metrics.jsonl            one JSON record per log line (see ``train/logging.py``)
    run_dir/checkpoints/last.pt      everything needed to continue exactly (``resume=True``)
    run_dir/checkpoints/best.pt      the same, at the best evaluation of ``objective.metric``
    run_dir/checkpoints/best.safetensors   the best model weights only, for sharing
    run_dir/tensorboard/             TensorBoard events, when tensorboard is installed

One step = one optimiser step over a global batch of ``cfg.batch_size`` items, split over ranks
and micro-batches (see ``train/sampler.py``). The data order is a pure function of
(seed, epoch, position), and ``last.pt`` is written only between optimiser steps, so a resumed run
continues exactly as if it had never stopped.
"""
from __future__ import annotations

import math
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
import yaml
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from longrange.errors import CheckpointError, ConfigError
from longrange.objectives.base import add_sums
from longrange.train import distributed as D
from longrange.train.checkpoint import (
    atomic_write,
    load_checkpoint,
    load_model_weights,
    rng_state,
    save_checkpoint,
    save_safetensors,
    set_rng_state,
)
from longrange.train.config import TrainConfig
from longrange.train.logging import METRICS_FILE, MetricsLogger, truncate_metrics
from longrange.train.optim import build_optimizer, group_report
from longrange.train.sampler import ShardedBatchSampler, eval_shards
from longrange.train.schedules import build_schedule


@dataclass(frozen=True)
class RunPaths:
    """The files of a run directory."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.root / METRICS_FILE

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def last(self) -> Path:
        return self.checkpoints / "last.pt"

    @property
    def best(self) -> Path:
        return self.checkpoints / "best.pt"

    @property
    def best_weights(self) -> Path:
        return self.checkpoints / "best.safetensors"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"


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
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ConfigError(f"config value {where} of type {type(value).__name__} cannot be saved to YAML")


def _seed_worker(worker_id: int) -> None:
    # torch seeds each worker's torch and python generators; numpy needs it done by hand.
    np.random.seed(torch.initial_seed() % 2**32)


def _derived_seed(*parts: int) -> int:
    return int(np.random.default_rng(list(parts)).integers(2**62))


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
        extra_config: saved in ``config.yaml`` beside the train config (e.g. model and task).
        resume: continue exactly from ``run_dir/checkpoints/last.pt``.
        overwrite: start afresh in a run directory that already holds a run (its metrics,
            checkpoints and TensorBoard events are deleted). Without it, that is an error.
        tensorboard: also write TensorBoard events when the package is installed.

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
    ):
        self.cfg = cfg = TrainConfig.from_dict(cfg) if isinstance(cfg, Mapping) else cfg
        cfg.validate()
        self.objective = objective
        self.train_set, self.val_set, self.test_set = train_set, val_set, test_set
        self.collate = collate
        self.paths = RunPaths(Path(run_dir))
        self.env = D.init_distributed(device)
        self.device = self.env.device
        self.is_main = self.env.is_main

        for attr in ("metric", "higher_is_better", "summarize"):
            if not hasattr(objective, attr):
                raise ConfigError(f"the objective {type(objective).__name__} has no '{attr}' (see objectives/base.py)")
        if cfg.precision == "fp16" and self.device.type != "cuda":
            raise ConfigError(
                f"train.precision 'fp16' needs a CUDA device (it uses a GradScaler); this run is on "
                f"{self.device.type}: use 'bf16' or 'fp32'"
            )
        self.micro_batch = cfg.micro_batch(self.env.world_size)
        for split, ds in (("train", train_set), ("val", val_set), ("test", test_set)):
            if ds is not None and not hasattr(ds, "__len__"):
                raise ConfigError(
                    f"the {split} set ({type(ds).__name__}) has no length: the trainer needs map-style datasets "
                    "(with __len__ and __getitem__) to derive a resumable batch order"
                )
        self.steps_per_epoch = len(train_set) // cfg.batch_size
        if self.steps_per_epoch == 0:
            raise ConfigError(
                f"train.batch_size {cfg.batch_size} is larger than the training set ({len(train_set)} items): "
                "no complete batch"
            )
        self.total_steps = cfg.max_steps if cfg.max_steps > 0 else cfg.epochs * self.steps_per_epoch

        # The training RNG stream (dropout, masking) differs per rank, else all ranks drop alike.
        random.seed(cfg.seed + self.env.rank)
        np.random.seed(cfg.seed + self.env.rank)
        torch.manual_seed(cfg.seed + self.env.rank)

        self.model = model.to(self.device)
        self.optimizer = build_optimizer(self.model, cfg)
        self.param_report = group_report(self.optimizer.param_groups)
        self.schedule = build_schedule(
            cfg, self.total_steps, higher_is_better=objective.higher_is_better, steps_per_epoch=self.steps_per_epoch
        )
        self.scaler = torch.amp.GradScaler(self.device.type) if cfg.precision == "fp16" else None

        # Progress of the run: everything here goes into the checkpoint.
        self.step = 0
        self.epoch = 0
        self.batches_done = 0          # global batches consumed in self.epoch
        self.data_seed = cfg.seed
        self.best_value: float | None = None
        self.best_step = -1
        self.best_metrics: dict[str, float] = {}
        self.bad_evals = 0
        self.stopped_early = False
        self.train_sums: dict[str, Tensor] | None = None
        self.train_loss = [0.0, 0]     # sum of step losses and steps since the last train log
        self.last_lr = cfg.lr * self.schedule.multiplier(0)
        self.elapsed = 0.0             # seconds of training in earlier (resumed) segments
        self._segment_start = time.time()
        self.history: list[dict[str, Any]] = []
        self._best_weights: dict[str, Tensor] | None = None
        self.final_val: dict[str, float] = {}

        #: Called as ``on_checkpoint(step, path)`` after ``last.pt`` is written (tests use it).
        self.on_checkpoint: Callable[[int, Path], None] | None = None

        self._prepare_run_dir(resume, overwrite)
        if resume:
            self._resume()
        self.logger = MetricsLogger(self.paths.root, enabled=self.is_main, tensorboard=tensorboard)
        if self.is_main:
            if resume and extra_config is None and self.paths.config.is_file():
                # Keep what the original run saved beside the train config (model, task, ...).
                extra_config = yaml.safe_load(self.paths.config.read_text()) or {}
            text = yaml.safe_dump(self._resolved_config(extra_config), sort_keys=False).encode()
            atomic_write(self.paths.config, lambda f: f.write(text))

        self.train_model = D.wrap_model(self.model, self.device, cfg.find_unused_parameters)

    # ------------------------------------------------------------------ run directory
    def _resolved_config(self, extra: Mapping[str, Any] | None) -> dict[str, Any]:
        out = _plain(dict(extra or {}), "extra_config")
        out["train"] = self.cfg.to_dict()
        return out

    def _prepare_run_dir(self, resume: bool, overwrite: bool) -> None:
        p = self.paths
        if resume:
            if not p.last.is_file():
                raise CheckpointError(f"cannot resume: no checkpoint at {p.last}")
            return
        existing = [f for f in (p.last, p.best, p.metrics) if f.exists()]
        if existing and not overwrite:
            raise ConfigError(
                f"run directory {p.root} already holds a run ({existing[0].name}); resume it, choose a new "
                "directory, or pass overwrite=True"
            )
        D.barrier()  # every rank has looked before rank 0 deletes
        if self.is_main:
            for f in (p.last, p.best, p.best_weights, p.metrics):
                f.unlink(missing_ok=True)
            if p.tensorboard.is_dir():
                for f in p.tensorboard.glob("events.out.tfevents.*"):
                    f.unlink()
            p.checkpoints.mkdir(parents=True, exist_ok=True)
        D.barrier()

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint_state(self) -> dict[str, Any]:
        """The run's state. A collective: every rank must call it (RNG states are gathered)."""
        rng = D.gather_objects(rng_state())
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "rng": rng,
            "data": {"epoch": self.epoch, "batches_done": self.batches_done, "seed": self.data_seed,
                     "batch_size": self.cfg.batch_size, "n_items": len(self.train_set)},
            "step": self.step,
            "best": {"value": self.best_value, "step": self.best_step, "metrics": dict(self.best_metrics)},
            "bad_evals": self.bad_evals,
            "stopped_early": self.stopped_early,
            "train_sums": {k: v.detach().to("cpu") for k, v in (self.train_sums or {}).items()},
            "train_loss": [float(self.train_loss[0]), int(self.train_loss[1])],
            "last_lr": self.last_lr,
            "metrics_lines": self.logger.lines if self.is_main else 0,
            "elapsed": self._elapsed(),
            "history": list(self.history),
            "final_val": dict(self.final_val),
            "config": self.cfg.to_dict(),
            "world_size": self.env.world_size,
        }

    def _save(self, best: bool) -> None:
        state = self._checkpoint_state()
        if self.is_main:
            if best:
                save_checkpoint(state, self.paths.best)
                save_safetensors(state["model"], self.paths.best_weights)
            save_checkpoint(state, self.paths.last)
        D.barrier()
        if self.on_checkpoint is not None:
            self.on_checkpoint(self.step, self.paths.last)

    def _resume(self) -> None:
        state = load_checkpoint(self.paths.last, map_location=self.device)
        data = state["data"]
        if data["batch_size"] != self.cfg.batch_size or data["n_items"] != len(self.train_set):
            raise ConfigError(
                f"cannot resume {self.paths.last}: it was trained with train.batch_size {data['batch_size']} on "
                f"{data['n_items']} items, this run has {self.cfg.batch_size} on {len(self.train_set)}"
            )
        load_model_weights(self.model, state["model"], source=self.paths.last)
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except ValueError as err:
            raise CheckpointError(f"the optimiser state in {self.paths.last} does not fit the model: {err}") from None
        self.schedule.load_state_dict(state["schedule"])
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])
        rng = state["rng"]
        if len(rng) == self.env.world_size:
            set_rng_state(rng[self.env.rank])
        else:  # another number of ranks: data order stays exact, random streams restart
            torch.manual_seed(_derived_seed(self.cfg.seed, state["step"], self.env.rank))
        self.epoch, self.batches_done, self.data_seed = data["epoch"], data["batches_done"], data["seed"]
        self.step = state["step"]
        best = state["best"]
        self.best_value, self.best_step, self.best_metrics = best["value"], best["step"], dict(best["metrics"])
        self.bad_evals = state["bad_evals"]
        self.stopped_early = state["stopped_early"]
        self.train_sums = dict(state["train_sums"]) or None
        self.train_loss = list(state["train_loss"])
        self.last_lr = state["last_lr"]
        self.elapsed = state["elapsed"]
        self.history = list(state["history"])
        self.final_val = dict(state["final_val"])
        if self.paths.best.is_file():
            self._best_weights = {k: v.to("cpu") for k, v in load_checkpoint(self.paths.best)["model"].items()}
        if self.is_main:  # drop records written after the checkpoint: they will be written again
            truncate_metrics(self.paths.metrics, state["metrics_lines"])

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
        while True:
            if self.batches_done >= self.steps_per_epoch:
                self.epoch += 1
                self.batches_done = 0
            if hasattr(self.train_set, "set_epoch"):
                self.train_set.set_epoch(self.epoch)
            sampler = ShardedBatchSampler(
                len(self.train_set), self.cfg.batch_size, self.data_seed, self.epoch,
                rank=self.env.rank, world_size=self.env.world_size, grad_accum=self.cfg.grad_accum,
                start_batch=self.batches_done,
            )
            seed = _derived_seed(self.data_seed, self.epoch, self.batches_done, self.env.rank)
            group: list[dict[str, Any]] = []
            for batch in self._loader(self.train_set, sampler, seed):
                group.append(batch)
                if len(group) == self.cfg.grad_accum:
                    yield group
                    group = []

    # ------------------------------------------------------------------ one step
    def _train_step(self, micro_batches: list[dict[str, Any]]) -> None:
        self.train_model.train()
        lr_mult = self.schedule.multiplier(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = group["peak_lr"] * lr_mult
        self.last_lr = self.cfg.lr * lr_mult
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
            self.train_sums = add_sums(self.train_sums, out.sums)
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
        self.train_loss[0] = self.train_loss[0] + step_loss  # a tensor: no device sync per step
        self.train_loss[1] += 1
        self.step += 1
        self.batches_done += 1

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
        return self.elapsed + time.time() - self._segment_start

    def _log(self, split: str, metrics: Mapping[str, float]) -> None:
        epoch = self.epoch + self.batches_done / self.steps_per_epoch
        self.logger.log(self.step, epoch, split, metrics, self.last_lr, self._elapsed())

    def _log_train(self) -> dict[str, float]:
        sums = D.all_reduce_sums(self.train_sums, self.device)
        steps = self.train_loss[1]
        loss = torch.tensor([float(self.train_loss[0]), float(steps)], dtype=torch.float64, device=self.device)
        if self.env.distributed:
            torch.distributed.all_reduce(loss)
            loss[0] /= self.env.world_size  # every rank counted every step
            loss[1] /= self.env.world_size
        metrics = {k: float(v) for k, v in self.objective.summarize(sums).items()} if sums else {}
        metrics.setdefault("loss", float(loss[0] / max(loss[1], 1.0)))
        self._log("train", metrics)
        self.train_sums, self.train_loss = None, [0.0, 0]
        return metrics

    def _validate(self) -> bool:
        """Evaluate on the validation set, track the best; True when it improved."""
        metrics = self.evaluate(self.val_set, "val")
        if self.objective.metric not in metrics:
            raise ConfigError(
                f"the selection metric {self.objective.metric!r} is not among the validation metrics "
                f"{sorted(metrics)}"
            )
        self._log("val", metrics)
        self.final_val = metrics
        value = metrics[self.objective.metric]
        self.history.append({"step": self.step, "metrics": metrics})
        self.schedule.observe(value)
        if self._better(value, self.best_value):
            self.best_value, self.best_step, self.best_metrics = value, self.step, metrics
            self.bad_evals = 0
            self._best_weights = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
            return True
        self.bad_evals += 1
        if self.cfg.patience and self.bad_evals >= self.cfg.patience:
            self.stopped_early = True
        return False

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, Any]:
        """Train to the end (or early stop), then evaluate the best weights on the test set.

        Leaves the model holding the best weights (the last ones when there is no validation set).
        Returns ``{"metric", "best": {"step", "value", "metrics"}, "final", "test", "step",
        "epochs", "stopped_early", "param_groups"}``.
        """
        cfg = self.cfg
        self._segment_start = time.time()
        show = self.is_main and cfg.progress and sys.stderr.isatty()
        bar = None
        if show:
            from tqdm import tqdm

            bar = tqdm(total=self.total_steps, initial=self.step, desc="train", dynamic_ncols=True)
        try:
            if self.step < self.total_steps and not self.stopped_early:
                for micro_batches in self._global_batches():
                    self._train_step(micro_batches)
                    if bar is not None:
                        bar.update(1)
                    done = self.step >= self.total_steps
                    if self.step % cfg.log_every == 0 or done:
                        train_metrics = self._log_train()
                        if bar is not None:
                            bar.set_postfix(loss=f"{train_metrics['loss']:.4g}", lr=f"{self.last_lr:.3g}")
                    epoch_end = self.batches_done == self.steps_per_epoch
                    evaluate = self.val_set is not None and (
                        done or (cfg.eval_every == 0 and epoch_end)
                        or (cfg.eval_every > 0 and self.step % cfg.eval_every == 0)
                    )
                    improved = self._validate() if evaluate else False
                    if evaluate or done or self.stopped_early or (
                        cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0
                    ):
                        if self.val_set is None and (done or self.stopped_early):
                            improved = True  # no selection: the final weights are the best
                            self.best_step = self.step
                            self._best_weights = {k: v.detach().to("cpu", copy=True)
                                                  for k, v in self.model.state_dict().items()}
                        self._save(best=improved)
                    if done or self.stopped_early:
                        break
        finally:
            if bar is not None:
                bar.close()

        test_metrics = None
        if self._best_weights is not None:
            self.model.load_state_dict(self._best_weights)
        if self.test_set is not None:
            test_metrics = self.evaluate(self.test_set, "test")
            self._log("test", test_metrics)
        self.logger.close()
        return {
            "metric": self.objective.metric,
            "best": {"step": self.best_step, "value": self.best_value, "metrics": dict(self.best_metrics)},
            "final": dict(self.final_val),
            "test": test_metrics,
            "step": self.step,
            "epochs": self.epoch + self.batches_done / self.steps_per_epoch,
            "stopped_early": self.stopped_early,
            "param_groups": self.param_report,
        }


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
        extra_config=extra_config, resume=resume, overwrite=overwrite, tensorboard=tensorboard,
    )
    try:
        return trainer.fit()
    finally:
        D.cleanup(trainer.env)
