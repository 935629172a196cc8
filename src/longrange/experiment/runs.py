"""One stage of an experiment: train from scratch, pretrain (SPT), or finetune a pretrained run.

Each stage is a run directory (see ``longrange.train.loop``) plus a ``summary.json``. Its
``config.yaml`` records everything needed to rebuild the model (``load_model``), so a finetuning
stage can start from any pretraining run.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from longrange.errors import CheckpointError, ConfigError
from longrange.experiment.config import ExperimentConfig, ObjectiveConfig, TaskConfig
from longrange.models.config import ModelConfig
from longrange.models.model import SequenceModel, build_model, parameter_report
from longrange.models.morph import morph_f1, morph_f1r1

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
            mask_id=vocab.mask_id if vocab is not None else 4,
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
) -> dict[str, Any]:
    """Run one stage and write ``summary.json``; returns the summary.

    stage "train": supervised from scratch; "pretrain": SPT with ``objective`` causal or masked;
    "finetune": supervised from the pretrained run ``init_from`` (and, for F1R1, the reverse-
    pretrained run ``reverse_from``).
    """
    from longrange.train.loop import train as train_loop

    if stage not in STAGES:
        raise ConfigError(f"unknown stage {stage!r}; expected {', '.join(STAGES)}")
    if stage == "finetune" and init_from is None:
        raise ConfigError("finetuning needs a pretrained run (--from RUN_DIR)")
    if stage != "finetune" and (init_from is not None or reverse_from is not None):
        raise ConfigError(f"stage {stage} starts from scratch; use finetune to start from a pretrained run")
    kind = objective or ("causal" if stage == "pretrain" else "supervised")
    if stage == "pretrain" and kind == "supervised":
        raise ConfigError("pretraining uses objective causal or masked")
    if stage != "pretrain" and kind != "supervised":
        raise ConfigError(f"stage {stage} trains on the task's labels; objective {kind!r} is for pretraining")

    task_cfg = exp.stage_task(stage)
    data = load_data(task_cfg)
    spec = data.spec
    model_cfg = exp.stage_model(stage)
    if stage == "pretrain":
        model_cfg = pretraining_model_config(model_cfg, kind)
    objective_fn, token_head = make_objective(kind, data, exp.objective, reverse=reverse)
    if token_head is None:
        head_kind, n_out = supervised_head(spec)
    else:
        head_kind, n_out = "tokens", token_head
    head = {
        "kind": head_kind,
        "n_out": n_out,
        "input_kind": spec.input_kind,
        "vocab_size": data.vocab_size,
        "d_input": spec.d_input,
        "mask_channel": kind == "masked" and spec.input_kind == "numeric",
    }
    if model_cfg.block == "hf" and data.vocab is not None:
        head["vocab"] = list(data.vocab.tokens)
    changes = {"seed": seed, **(train_changes or {})}
    if stage == "pretrain" and model_cfg.pooling == "cls":
        changes.setdefault("find_unused_parameters", True)  # the CLS vector is not used by a token head
    train_cfg = exp.train_config(stage, **changes)

    import torch

    torch.manual_seed(seed)
    model = _build_from_record(model_cfg.to_dict(), head)
    if hasattr(model, "rebuild_info"):
        head["hf_resolved"] = model.rebuild_info()
    transfer = None
    morph = None
    if stage == "finetune":
        source = load_model(init_from)
        reverse_model = load_model(reverse_from) if reverse_from is not None else None
        source, morph = _prepare_source(source, model, reverse_model)
        transfer = transfer_pretrained(model, source)
        print(
            f"finetune: {transfer['transferred']} tensors from {init_from}"
            + (f" (morphed {morph.upper()})" if morph else "")
            + f"; not transferred: {', '.join(transfer['not_transferred']) or 'none'}"
            + f"; newly initialised: {', '.join(transfer['newly_initialised']) or 'none'}",
            file=sys.stderr,
        )

    if regime is None:
        if stage == "finetune":
            regime = f"{morph or read_run_config(init_from)['objective']['kind']}-spt"
        else:
            regime = {"train": "scratch", "pretrain": f"{kind}-spt"}[stage]
    record = {
        "label": exp.label,
        "regime": regime,
        "stage": stage,
        "seed": seed,
        "task": {"name": task_cfg.name, "options": task_cfg.options, "data_dir": task_cfg.data_dir,
                 "train_subset": task_cfg.train_subset, "seed": task_cfg.seed},
        "model": model_cfg.to_dict(),
        "head": head,
        "objective": {"kind": kind, "reverse": reverse, **vars(exp.objective)},
        "init": {"from": str(init_from) if init_from else None, "reverse_from": str(reverse_from) if reverse_from else None,
                 "morph": morph, "transfer": transfer},
    }
    start = time.time()
    result = train_loop(
        model, objective_fn, data, train_cfg, run_dir,
        extra_config=record, resume=resume, overwrite=overwrite, evaluate_test=stage != "pretrain",
    )
    summary = {
        "task": exp.task.name,
        "label": exp.label,
        "regime": regime,
        "stage": stage,
        "seed": seed,
        "metric": result["metric"],
        "higher_is_better": objective_fn.higher_is_better,
        "best_val": result["best"]["metrics"],
        "test": result["test"],
        "steps": result["step"],
        "epochs": result["epochs"],
        "stopped_early": result["stopped_early"],
        "params": {k: v for k, v in parameter_report(model).items() if k in ("total", "in_primitives")},
        "pretrain_run": os.path.relpath(init_from, run_dir) if init_from else None,
        "seconds": time.time() - start,
    }
    from longrange.train import distributed

    if distributed.is_main_process():
        path = Path(run_dir) / SUMMARY
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(summary, indent=2))
        os.replace(tmp, path)
    return summary
