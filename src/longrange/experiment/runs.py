"""One stage of an experiment: train from scratch, pretrain (SPT), or finetune a pretrained run.

Each stage is a run directory (see ``longrange.train.loop``) plus a ``summary.json``. Its
``config.yaml`` records everything needed to rebuild the model (``load_model``), so a finetuning
stage can start from any pretraining run.
"""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from longrange.data.tokenize import MASK_ID
from longrange.errors import CheckpointError, ConfigError
from longrange.experiment.config import OBJECTIVES, ExperimentConfig, ObjectiveConfig, TaskConfig
from longrange.models.config import ModelConfig
from longrange.models.model import SequenceModel, build_model, parameter_report
from longrange.models.morph import morph_f1, morph_f1r1
from longrange.train import rundir
from longrange.train.config import TrainConfig

STAGES = ("train", "pretrain", "finetune")
SUMMARY = "summary.json"

_DATA_CACHE: dict[str, Any] = {}


def load_data(task: TaskConfig):
    """The task's data, loaded once per process for the same task settings."""
    from longrange.data.tasks import load_task

    t = task
    key = json.dumps([t.name, t.options, t.data_dir, t.train_subset, t.skip_bad, t.seed], sort_keys=True, default=str)
    if key not in _DATA_CACHE:
        _DATA_CACHE[key] = load_task(
            t.name, t.data_dir, seed=t.seed, train_subset=t.train_subset, skip_bad=t.skip_bad, **t.options
        )
    return _DATA_CACHE[key]


def supervised_head(spec) -> tuple[str, int]:
    if spec.two_sequences:
        return "retrieval", spec.n_classes
    if spec.n_classes == 0:
        return "regress", spec.n_targets
    return "classify", spec.n_classes


def make_objective(kind: str, data, options: ObjectiveConfig, reverse: bool = False):
    """The objective of a stage and the token-head size it needs (None for supervised heads)."""
    from longrange.objectives.pretraining import MaskedPrediction, NextTokenPrediction
    from longrange.objectives.supervised import Classification, Regression

    spec = data.spec
    if kind == "supervised":
        if reverse:
            raise ConfigError("reverse sequences are a pretraining option (objective causal)")
        return (Regression() if spec.n_classes == 0 else Classification()), None
    value_range = tuple(options.value_range) if options.value_range is not None else None
    if kind == "causal":
        objective = NextTokenPrediction(spec.input_kind, options.numeric_loss, options.levels, value_range, reverse=reverse)
    elif kind == "masked":
        if reverse:
            raise ConfigError("reverse sequences are an option of causal pretraining (for F1R1)")
        vocab = data.vocab
        objective = MaskedPrediction(
            spec.input_kind,
            options.mask_ratio if options.mask_ratio is not None else spec.mask_ratio,
            mask_id=vocab.mask_id if vocab is not None else MASK_ID,
            vocab_size=data.vocab_size,
            bert=options.bert,
            span=options.span,
            numeric_loss=options.numeric_loss,
            levels=options.levels,
            value_range=value_range,
        )
    else:
        raise ConfigError(f"unknown objective {kind!r}; expected supervised, causal or masked")
    return objective, objective.head_size(data.vocab_size, spec.d_input)


def pretraining_model_config(cfg: ModelConfig, objective: str) -> ModelConfig:
    """Next-token pretraining needs a causal backbone. A bidirectional Mamba model is pretrained
    causally and morphed (F1) when finetuned; other bidirectional models cannot be."""
    if objective != "causal" or cfg.direction != "bidirectional":
        return cfg
    if cfg.block == "mamba":
        return cfg.replace(direction="causal")
    raise ConfigError(
        f"causal pretraining of a bidirectional {cfg.block}-{cfg.primitive} model would leave its reverse "
        "parameters untrained; use objective masked, or model.direction=causal (only Mamba blocks can be "
        "morphed from causal to bidirectional, by F1)"
    )


# --------------------------------------------------------------------------------- run dirs
def read_run_config(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise CheckpointError(f"{run_dir} is not a run directory (no config.yaml)")
    return yaml.safe_load(path.read_text())


def read_summary(run_dir: str | Path) -> dict[str, Any] | None:
    path = Path(run_dir) / SUMMARY
    return json.loads(path.read_text()) if path.is_file() else None


def _build_from_record(model_cfg: dict, head: dict) -> SequenceModel:
    return build_model(
        ModelConfig.from_dict(model_cfg),
        input_kind=head["input_kind"],
        head=head["kind"],
        n_out=head["n_out"],
        vocab_size=head.get("vocab_size"),
        d_input=head.get("d_input", 1),
        mask_channel=head.get("mask_channel", False),
        vocab=head.get("vocab"),  # block hf: the task's tokens, mapped to a pretrained LM's
        hf_resolved=head.get("hf_resolved"),  # block hf: rebuilds the LM without its snapshot
    )


def load_model(run_dir: str | Path, which: str = "best") -> SequenceModel:
    """Rebuild a run's model from its config.yaml and load its best (or last) weights."""
    from longrange.train.checkpoint import load_weights

    run_dir = Path(run_dir)
    record = read_run_config(run_dir)
    if "head" not in record or "model" not in record:
        raise CheckpointError(f"{run_dir}/config.yaml does not describe a longrange model (no 'model'/'head')")
    model = _build_from_record(record["model"], record["head"])
    candidates = [run_dir / "checkpoints" / f"{which}.safetensors", run_dir / "checkpoints" / f"{which}.pt"]
    for path in candidates:
        if path.is_file():
            load_weights(path, model)
            return model.eval()
    raise CheckpointError(f"{run_dir} has no {which} weights ({', '.join(str(p) for p in candidates)})")


def _prepare_source(source: SequenceModel, target: SequenceModel, reverse: SequenceModel | None) -> tuple[SequenceModel, str | None]:
    """Make a pretrained model structurally fit the finetuning model: drop the mask channel, morph."""
    for model in (source, reverse):
        if model is not None and hasattr(model.encoder, "drop_mask_channel"):
            model.encoder.drop_mask_channel()
    if reverse is not None:
        if target.cfg.direction != "bidirectional":
            raise ConfigError("F1R1 (a reverse-pretrained model) initialises a bidirectional model: set model.direction=bidirectional")
        return morph_f1r1(source, reverse), "f1r1"
    if source.cfg.direction == "causal" and target.cfg.direction == "bidirectional":
        if source.cfg.block != "mamba":
            raise ConfigError(
                f"a causally pretrained {source.cfg.block} model cannot initialise a bidirectional one "
                "(its reverse parameters were never trained); pretrain with objective masked"
            )
        return morph_f1(source), "f1"
    return source, None


def _config_differences(a: ModelConfig, b: ModelConfig) -> dict[str, tuple[Any, Any]]:
    # may change between pretraining and finetuning (the head is not transferred)
    free = {"dropout", "pooling", "direction", "head_layers", "head_hidden", "head_activation"}
    da, db = a.to_dict(), b.to_dict()
    return {k: (da[k], db[k]) for k in da if k not in free and da[k] != db[k]}


def transfer_pretrained(target: SequenceModel, source: SequenceModel) -> dict[str, Any]:
    """Copy the encoder and backbone of ``source`` into ``target`` (the head stays fresh).

    Every backbone and encoder tensor of the target must come from the source: a missing tensor or
    a shape mismatch is an error naming it. Returns what was and was not transferred.
    """
    diff = _config_differences(source.cfg, target.cfg)
    if diff:
        raise ConfigError(f"the pretrained model differs from the finetuning model in {diff} (pretrained, finetuning)")
    src, tgt = source.state_dict(), target.state_dict()
    body = [k for k in tgt if k.startswith(("encoder.", "backbone."))]
    missing = [k for k in body if k not in src]
    shapes = [f"{k}: pretrained {tuple(src[k].shape)} vs model {tuple(tgt[k].shape)}" for k in body if k in src and src[k].shape != tgt[k].shape]
    if missing or shapes:
        raise CheckpointError(
            "the pretrained weights do not cover the model's encoder and backbone: "
            + "; ".join(filter(None, [f"missing {missing}" if missing else "", f"shape mismatches {shapes}" if shapes else ""]))
        )
    target.load_state_dict({**tgt, **{k: src[k] for k in body}})
    return {
        "transferred": len(body),
        "not_transferred": sorted(k for k in src if k not in body),
        "newly_initialised": sorted(k for k in tgt if k not in body),
    }


# ------------------------------------------------------------------------------------ stage
@dataclass
class StagePlan:
    """Everything a stage is, decided before any data is loaded (``plan_stage``)."""

    exp: ExperimentConfig
    stage: str
    seed: int
    objective: str                 # supervised, causal or masked
    reverse: bool
    regime: str
    task: TaskConfig
    model: ModelConfig
    train: TrainConfig
    init_from: Path | None = None
    reverse_from: Path | None = None

    def config(self) -> dict[str, Any]:
        """The stage's resolved configuration as saved in config.yaml (without the ``head``, which
        comes from the data, and the ``record`` written after the run). Its identity is the
        stage's fingerprint (``longrange.train.rundir``)."""
        from longrange import __version__

        t = self.task
        return {
            "label": self.exp.label,
            "regime": self.regime,
            "stage": self.stage,
            "seed": self.seed,
            "task": {"name": t.name, "options": t.options, "data_dir": t.data_dir,
                     "train_subset": t.train_subset, "skip_bad": t.skip_bad, "seed": t.seed},
            "data": data_identity(t),
            "model": self.model.to_dict(),
            "objective": {"kind": self.objective, "reverse": self.reverse, **vars(self.exp.objective)},
            "init": {"from": _run_fingerprint(self.init_from), "reverse_from": _run_fingerprint(self.reverse_from)},
            "code": {"longrange": __version__},
            "train": self.train.to_dict(),
        }

    def fingerprint(self) -> str:
        return rundir.fingerprint(self.config())


_IDENTITY_CACHE: dict[str, dict[str, str]] = {}


def data_identity(task: TaskConfig) -> dict[str, str]:
    """The identity of a task's data files (see ``longrange.data.tasks.data_identity``), once per process."""
    from longrange.data.tasks import data_identity as identity

    key = json.dumps([task.name, task.data_dir, task.options], sort_keys=True, default=str)
    if key not in _IDENTITY_CACHE:
        _IDENTITY_CACHE[key] = identity(task.name, task.data_dir, **task.options)
    return _IDENTITY_CACHE[key]


def _run_fingerprint(run_dir: Path | None) -> str | None:
    if run_dir is None:
        return None
    config = rundir.read_config(run_dir)
    if config is None or "fingerprint" not in config:
        raise CheckpointError(f"{run_dir} is not a finished longrange run (no fingerprint in its config.yaml)")
    return str(config["fingerprint"])


def plan_stage(
    exp: ExperimentConfig,
    stage: str,
    *,
    seed: int = 0,
    regime: str | None = None,
    objective: str | None = None,
    reverse: bool = False,
    init_from: str | Path | None = None,
    reverse_from: str | Path | None = None,
    train_changes: dict[str, Any] | None = None,
) -> StagePlan:
    """Check a stage's settings and resolve its task, model and training configs (no data loaded)."""
    if stage not in STAGES:
        raise ConfigError(f"unknown stage {stage!r}; expected {', '.join(STAGES)}")
    if stage == "finetune" and init_from is None:
        raise ConfigError("finetuning needs a pretrained run (--from RUN_DIR)")
    if stage != "finetune" and (init_from is not None or reverse_from is not None):
        raise ConfigError(f"stage {stage} starts from scratch; use finetune to start from a pretrained run")
    kind = objective or ("causal" if stage == "pretrain" else "supervised")
    if kind not in OBJECTIVES:
        raise ConfigError(f"unknown objective {kind!r}; expected {', '.join(OBJECTIVES)}")
    if stage == "pretrain" and kind == "supervised":
        raise ConfigError("pretraining uses objective causal or masked")
    if stage != "pretrain" and kind != "supervised":
        raise ConfigError(f"stage {stage} trains on the task's labels; objective {kind!r} is for pretraining")
    if reverse and kind != "causal":
        raise ConfigError("reverse sequences are an option of causal pretraining (for F1R1)")
    model_cfg = exp.stage_model(stage)
    if stage == "pretrain":
        model_cfg = pretraining_model_config(model_cfg, kind)
    changes = {"seed": seed, **(train_changes or {})}
    if stage == "pretrain" and model_cfg.pooling == "cls":
        changes.setdefault("find_unused_parameters", True)  # the CLS vector is not used by a token head
    init_from = Path(init_from) if init_from is not None else None
    reverse_from = Path(reverse_from) if reverse_from is not None else None
    if regime is None:
        if stage == "finetune":
            source = read_run_config(init_from)
            morphs = reverse_from is not None or (source.get("model", {}).get("direction") == "causal"
                                                  and model_cfg.direction == "bidirectional")
            regime = f"{('f1r1' if reverse_from is not None else 'f1') if morphs else source['objective']['kind']}-spt"
        else:
            regime = {"train": "scratch", "pretrain": f"{kind}-spt"}[stage]
    return StagePlan(exp=exp, stage=stage, seed=seed, objective=kind, reverse=reverse, regime=regime,
                     task=exp.stage_task(stage), model=model_cfg, train=exp.train_config(stage, **changes),
                     init_from=init_from, reverse_from=reverse_from)


@dataclass
class BuiltStage:
    """The model, objective and head of a stage, built on its data."""

    model: SequenceModel
    objective: Any
    head: dict[str, Any]


def build_stage(plan: StagePlan, data) -> BuiltStage:
    """The stage's objective and a freshly initialised model (seeded by the stage's seed)."""
    import torch

    spec = data.spec
    objective_fn, token_head = make_objective(plan.objective, data, plan.exp.objective, reverse=plan.reverse)
    head_kind, n_out = supervised_head(spec) if token_head is None else ("tokens", token_head)
    head = {
        "kind": head_kind,
        "n_out": n_out,
        "input_kind": spec.input_kind,
        "vocab_size": data.vocab_size,
        "d_input": spec.d_input,
        "mask_channel": plan.objective == "masked" and spec.input_kind == "numeric",
    }
    if plan.model.block == "hf" and data.vocab is not None:
        head["vocab"] = list(data.vocab.tokens)  # mapped to a pretrained LM's tokens
    torch.manual_seed(plan.seed)
    model = _build_from_record(plan.model.to_dict(), head)
    if hasattr(model, "rebuild_info"):
        head["hf_resolved"] = model.rebuild_info()  # rebuilds the LM without its snapshot
    return BuiltStage(model, objective_fn, head)


def transfer_stage(plan: StagePlan, model: SequenceModel) -> dict[str, Any] | None:
    """Finetuning: load the pretrained encoder and backbone into ``model`` (morphing F1/F1R1 when
    needed) and say what was transferred. Other stages: None."""
    if plan.stage != "finetune":
        return None
    source = load_model(plan.init_from)
    reverse_model = load_model(plan.reverse_from) if plan.reverse_from is not None else None
    source, morph = _prepare_source(source, model, reverse_model)
    transfer = {**transfer_pretrained(model, source), "morph": morph}
    print(
        f"finetune: {transfer['transferred']} tensors from {plan.init_from}"
        + (f" (morphed {morph.upper()})" if morph else "")
        + f"; not transferred: {', '.join(transfer['not_transferred']) or 'none'}"
        + f"; newly initialised: {', '.join(transfer['newly_initialised']) or 'none'}",
        file=sys.stderr,
    )
    return transfer


def run_record(plan: StagePlan, data, transfer: dict[str, Any] | None) -> dict[str, Any]:
    """What the run directory records beside its settings: where the data came from, what was
    skipped, software versions, what was transferred. Not part of the fingerprint."""
    import platform
    import socket

    import torch

    from longrange import __version__

    skipped = {str(k): int(v) for k, v in (getattr(data, "skipped", None) or {}).items()}
    return {
        "data_dir": data_identity(plan.task)["dir"],
        "skip_bad": plan.task.skip_bad,
        "skipped": skipped,
        "train_size": len(data.train),
        "versions": {"longrange": __version__, "torch": str(torch.__version__), "cuda": torch.version.cuda,
                     "python": platform.python_version()},
        "host": socket.gethostname(),
        "init": {"from": str(plan.init_from) if plan.init_from else None,
                 "reverse_from": str(plan.reverse_from) if plan.reverse_from else None},
        "transfer": transfer,
    }


def stage_summary(plan: StagePlan, built: BuiltStage, result: dict[str, Any], record: dict[str, Any],
                  run_dir: Path) -> dict[str, Any]:
    """The stage's ``summary.json``: its result, how long it took, and what it was made from."""
    return _finite({
        "task": plan.exp.task.name,
        "label": plan.exp.label,
        "regime": plan.regime,
        "stage": plan.stage,
        "seed": plan.seed,
        "metric": result["metric"],
        "higher_is_better": built.objective.higher_is_better,
        "best_val": result["best"]["metrics"],
        "test": result["test"],
        "steps": result["step"],
        "epochs": result["epochs"],
        "stopped_early": result["stopped_early"],
        "params": {k: v for k, v in parameter_report(built.model).items() if k in ("total", "in_primitives")},
        "pretrain_run": os.path.relpath(plan.init_from, run_dir) if plan.init_from else None,
        "train_subset": plan.task.train_subset,
        "train_size": record["train_size"],
        "seconds": result["seconds"],
        "fingerprint": plan.fingerprint(),
        "data_dir": record["data_dir"],
        "skip_bad": record["skip_bad"],
        "skipped": record["skipped"],
        "versions": record["versions"],
    })


def _finite(value: Any) -> Any:
    """Non-finite floats as None, so that summary.json is always valid JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    from longrange.train.checkpoint import atomic_write

    text = json.dumps(summary, indent=2, allow_nan=False).encode()
    atomic_write(rundir.RunPaths(run_dir).summary, lambda f: f.write(text))


def run_stage(
    exp: ExperimentConfig,
    stage: str,
    run_dir: str | Path,
    *,
    seed: int = 0,
    regime: str | None = None,
    objective: str | None = None,
    reverse: bool = False,
    init_from: str | Path | None = None,
    reverse_from: str | Path | None = None,
    train_changes: dict[str, Any] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    lock: rundir.RunLock | None = None,
) -> dict[str, Any]:
    """Run one stage and write ``summary.json``; returns the summary.

    stage "train": supervised from scratch; "pretrain": SPT with ``objective`` causal or masked;
    "finetune": supervised from the pretrained run ``init_from`` (and, for F1R1, the reverse-
    pretrained run ``reverse_from``). In steps: :func:`plan_stage` (settings, no data) ->
    :func:`build_stage` (data, model, objective) -> :func:`transfer_stage` (pretrained weights) ->
    the training loop -> :func:`stage_summary` (the record).

    ``resume`` continues the run in ``run_dir`` from its last checkpoint, only if it was made with
    the same settings (its fingerprint); a finished run is returned as it is, never rewritten.
    The run directory is locked while the stage runs (``lock``: one the caller already holds).
    """
    from longrange.train import distributed
    from longrange.train.loop import train as train_loop

    if resume and overwrite:
        raise ConfigError("--resume and --overwrite contradict each other: resume a run, or replace it")
    run_dir = rundir.check_out_dir(run_dir)
    plan = plan_stage(exp, stage, seed=seed, regime=regime, objective=objective, reverse=reverse,
                      init_from=init_from, reverse_from=reverse_from, train_changes=train_changes)
    config = plan.config()
    own_lock = lock is None and distributed.is_main_process()
    if own_lock:
        lock = rundir.RunLock(run_dir).acquire()
    try:
        done = read_summary(run_dir)
        if resume and done is not None:
            rundir.check_same_run(run_dir, config, "resume")
            print(f"{run_dir} already finished; its summary is unchanged", file=sys.stderr)
            return done
        data = load_data(plan.task)
        built = build_stage(plan, data)
        transfer = transfer_stage(plan, built.model)
        record = run_record(plan, data, transfer)
        result = train_loop(
            built.model, built.objective, data, plan.train, run_dir,
            extra_config={**{k: v for k, v in config.items() if k != "train"}, "head": built.head, "record": record},
            resume=resume, overwrite=overwrite, evaluate_test=stage != "pretrain", lock=lock or False,
        )
        summary = stage_summary(plan, built, result, record, run_dir)
        if distributed.is_main_process():
            write_summary(run_dir, summary)
        return summary
    finally:
        if own_lock:
            lock.release()
