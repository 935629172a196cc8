"""The cells of a comparison: presets x configs x swept values, each an experiment with its own label.

``longrange compare`` (and ``longrange params``) take

* ``--preset P`` (repeatable): a built-in preset or a YAML experiment file, one model each;
* ``--config C`` (repeatable): a YAML file applied on top of each preset (alone when no preset is
  given: each config is then an experiment of its own);
* ``FIELD=VALUE`` settings applied to every cell; a value with commas outside brackets,
  ``model.d_model=36,64``, is a sweep: one cell per value (several sweeps: every combination).

A cell's label is its experiment's label, followed, when the grid varies them, by the config's file
name and the swept values: ``S4D (wide, d_model=36)``. Its stages are run, reused and resumed as any
other (their ids contain the label). A list value is written in brackets and is not a sweep:
``compare.objectives=[causal,masked]``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from longrange.errors import ConfigError
from longrange.experiment.config import ExperimentConfig, resolve

#: Sections that say how the grid runs rather than what a cell is: not sweepable.
NOT_SWEPT = ("compare.",)


def split_top_level(raw: str) -> list[str]:
    """``raw`` split at the commas outside brackets, braces and quotes: ``36,64`` -> ``[36, 64]``;
    ``[0,1]`` and ``{a: 1, b: 2}`` stay whole."""
    parts, depth, quote, current = [], 0, "", []
    for ch in raw:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    parts.append("".join(current))
    return parts


def sweeps(settings: Sequence[str]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(the settings of every cell, the swept fields with their values as written)."""
    fixed, swept = [], []
    for item in settings:
        key, sep, raw = item.partition("=")
        values = split_top_level(raw) if sep else [raw]
        if len(values) < 2:
            fixed.append(item)
            continue
        key = key.strip()
        if key.startswith(NOT_SWEPT):
            raise ConfigError(
                f"{item!r}: {key} says how the grid runs, not what a cell is, so it cannot be swept; "
                "write a list in brackets ([0,1]) or use the option (--seeds, --objectives)"
            )
        if any(not v.strip() for v in values):
            raise ConfigError(f"{item!r}: an empty value in the sweep of {key}")
        if any(key == k for k, _ in swept):
            raise ConfigError(f"{key} is swept twice; give its values once, comma-separated")
        swept.append((key, [v.strip() for v in values]))
    return fixed, swept


def _short_names(keys: Sequence[str]) -> dict[str, str]:
    """Each swept field by its last part (``d_model``), or in full where two share it."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


@dataclass
class SweepCell:
    """One cell of a comparison's sweep: an experiment at one combination of the swept values."""

    name: str  # what made it: ``demo/s4d (d_model=36)``
    exp: ExperimentConfig  # its experiment, labelled
    swept: tuple[str, ...]  # its swept values (``d_model=36``): cells with the same compare models


def cells(
    presets: Sequence[str] = (), configs: Sequence[str | Path] = (), settings: Sequence[str] = ()
) -> list[ExperimentConfig]:
    """The experiments of a comparison: each preset (or none) x each config (or none) x each combination
    of swept values, in that order, labelled as the module docstring says."""
    return [cell.exp for cell in named_cells(presets, configs, settings)]


def model_groups(found: Sequence[SweepCell]) -> list[list[int]]:
    """The indices of the cells that compare models at the same swept values (one group without a
    sweep): the cells whose sizes should match."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, cell in enumerate(found):
        groups.setdefault(cell.swept, []).append(i)
    return list(groups.values())


def named_cells(
    presets: Sequence[str] = (), configs: Sequence[str | Path] = (), settings: Sequence[str] = ()
) -> list[SweepCell]:
    """:func:`cells` as :class:`SweepCell`\\ s, with the name of what made each and its swept values."""
    if not presets and not configs:
        raise ConfigError("give at least one --preset (repeatable) or --config")
    fixed, swept = sweeps(settings)
    names = _short_names([k for k, _ in swept])
    stems = [Path(c).stem for c in configs]
    if len(set(stems)) < len(stems):
        raise ConfigError(
            f"two --config files share the name {next(s for s in stems if stems.count(s) > 1)!r}; "
            "cells are labelled by it: rename one"
        )
    name_config = len(configs) > 1 and bool(presets)
    out = []
    for preset in presets or [None]:
        for config, stem in zip(configs or [None], stems or [None]):
            for values in itertools.product(*[v for _, v in swept]):
                overrides = fixed + [f"{k}={v}" for (k, _), v in zip(swept, values)]
                exp = resolve(preset, config, overrides)
                parts = ([stem] if name_config else []) + [f"{names[k]}={v}" for (k, _), v in zip(swept, values)]
                if parts:
                    exp.label = f"{exp.label} ({', '.join(parts)})"
                source = " + ".join(str(x) for x in (preset, config) if x is not None)
                swept_parts = tuple(f"{names[k]}={v}" for (k, _), v in zip(swept, values))
                out.append(
                    SweepCell(source + (f" ({', '.join(swept_parts)})" if swept_parts else ""), exp, swept_parts)
                )
    return out
