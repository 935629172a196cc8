"""AdamW parameter groups from the optimiser hints that layers attach to their parameters.

Layers mark parameters with :func:`longrange.layers.base.set_optim_hint` instead of the trainer
knowing layer names. The groups:

  ``default``   unhinted parameters: ``lr`` and ``weight_decay`` of the config;
  ``ssm``       hinted ``group="ssm"``: ``lr * ssm_lr_scale`` and ``ssm_weight_decay``;
  ``no_decay``  hinted ``group="no_decay"`` (and, with ``weight_decay_1d=False``, unhinted
                parameters with fewer than 2 dimensions): full ``lr``, weight decay 0.

A hint may pin ``lr_scale`` and/or ``weight_decay``; parameters with the same group and pinned
values share one optimiser group (named e.g. ``ssm[lr_scale=0.5]``). A hint naming another group
must pin both values. Each group carries ``peak_lr`` (the lr before the schedule) and ``name``.

Rules by name (``cfg.param_groups``) come first: the first rule whose ``match`` glob (``fnmatch``,
``*`` also crossing dots) matches a parameter's qualified name sets its ``lr`` (absolute) or
``lr_scale`` (× ``cfg.lr``) and/or ``weight_decay``; what a rule leaves unset comes from the hints
as above. Its group is named ``match:<glob>`` (``match:<glob>+<hint group>`` when the rule leaves
a value to the hints). A rule that matches no trainable parameter, or only parameters that an
earlier rule took, is an error naming it, so a misspelt name never silently does nothing.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

import torch
from torch import nn

from longrange.errors import ConfigError
from longrange.layers.base import NO_DECAY_GROUP, SSM_GROUP, get_optim_hint

DEFAULT_GROUP = "default"


def _group_settings(cfg, name: str, hint: dict[str, Any], param_name: str) -> tuple[float, float]:
    if name == DEFAULT_GROUP:
        scale, decay = 1.0, cfg.weight_decay
    elif name == SSM_GROUP:
        scale, decay = cfg.ssm_lr_scale, cfg.ssm_weight_decay
    elif name == NO_DECAY_GROUP:
        scale, decay = 1.0, 0.0
    elif "lr_scale" in hint and "weight_decay" in hint:
        scale, decay = 1.0, 0.0  # both replaced below
    else:
        raise ConfigError(
            f"parameter {param_name!r} has an optimiser hint with unknown group {name!r}; known groups: "
            f"{SSM_GROUP}, {NO_DECAY_GROUP} (a custom group must pin both lr_scale and weight_decay)"
        )
    return float(hint.get("lr_scale", scale)), float(hint.get("weight_decay", decay))


def param_groups(model: nn.Module, cfg) -> list[dict[str, Any]]:
    """AdamW parameter groups of ``model``'s trainable parameters, honouring their hints.

    Shared (tied) parameters appear once; frozen parameters (``requires_grad=False``) are left out.
    Groups are ordered by first appearance, so the order is stable across runs (checkpoints rely
    on it).
    """
    rules = list(getattr(cfg, "param_groups", None) or [])
    matched = [0] * len(rules)
    groups: dict[tuple[str, float, float], dict[str, Any]] = {}
    seen: set[int] = set()
    names: list[str] = []
    for param_name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen or not param.requires_grad:
            continue
        seen.add(id(param))
        names.append(param_name)
        hint = get_optim_hint(param)
        name = hint.get("group", DEFAULT_GROUP)
        if name == DEFAULT_GROUP and not cfg.weight_decay_1d and param.dim() < 2:
            name = NO_DECAY_GROUP
        scale, decay = _group_settings(cfg, name, hint, param_name)
        lr = cfg.lr * scale
        pinned = [f"{k}={hint[k]:g}" for k in ("lr_scale", "weight_decay") if k in hint]
        label = name + (f"[{','.join(pinned)}]" if pinned else "")
        rule_index = next((i for i, r in enumerate(rules) if fnmatchcase(param_name, r["match"])), None)
        if rule_index is not None:
            rule = rules[rule_index]
            matched[rule_index] += 1
            if "lr" in rule:
                lr = float(rule["lr"])
            elif "lr_scale" in rule:
                lr = cfg.lr * float(rule["lr_scale"])
            decay = float(rule.get("weight_decay", decay))
            full = ("lr" in rule or "lr_scale" in rule) and "weight_decay" in rule
            label = f"match:{rule['match']}" + ("" if full else f"+{label}")
        key = (label, lr, decay)
        if key not in groups:
            groups[key] = {
                "name": label,
                "params": [],
                "param_names": [],
                "lr": lr,
                "peak_lr": lr,
                "weight_decay": decay,
            }
        groups[key]["params"].append(param)
        groups[key]["param_names"].append(param_name)
    if not groups:
        raise ConfigError("the model has no trainable parameters")
    for i, count in enumerate(matched):
        if count == 0:
            pattern = rules[i]["match"]
            hits = [n for n in names if fnmatchcase(n, pattern)]
            why = "matches no trainable parameter"
            if hits:
                j = next(k for k, r in enumerate(rules) if fnmatchcase(hits[0], r["match"]))
                why = f"matches only parameters that earlier rules took (e.g. {hits[0]!r} by train.param_groups[{j}]; first match wins)"
            raise ConfigError(
                f"train.param_groups[{i}] (match {pattern!r}) {why}; parameter names look like "
                f"{', '.join(repr(n) for n in names[:4])}, ... (globs match the whole qualified name: '*.C' "
                "matches 'backbone.blocks.0.mixer.C')"
            )
    return list(groups.values())


def group_report(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per group: number of tensors, number of scalar parameters, peak lr and weight decay."""
    return {
        g["name"]: {
            "tensors": len(g["params"]),
            "parameters": int(sum(p.numel() for p in g["params"])),
            "lr": g["peak_lr"],
            "weight_decay": g["weight_decay"],
        }
        for g in groups
    }


def build_optimizer(model: nn.Module, cfg) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups` (the ``param_names`` lists are dropped)."""
    groups = [{k: v for k, v in g.items() if k != "param_names"} for g in param_groups(model, cfg)]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
