"""``longrange params``: parameter counts of models, in total and inside the sequence primitives, and the
recurrent state each carries per sequence at its task's length (Zoology's state size).

The default table is the thesis' Table 3; ``--preset``, ``--config`` and ``FIELD=VALUE`` settings
(sweeps included) count the models of experiments as ``longrange compare`` builds them, and
``--match PRESET --vary FIELD`` finds the value of a field whose count is closest to another
model's (``experiment/params.py``).
"""

from __future__ import annotations

import argparse

from longrange.errors import ConfigError

# The thesis' Table 3 models (Cifar10-numerical: 3 input channels, 10 classes, 6 layers).
TABLE3 = {
    "Mamba-S6": dict(block="mamba", primitive="s6", d_model=116, d_state=16),
    "Mamba-S4D": dict(block="mamba", primitive="s4d", d_model=116, d_state=16),
    "Mamba-S4": dict(block="mamba", primitive="s4", d_model=116, d_state=16),
    "Simple-S4D": dict(block="simple", primitive="s4d", d_model=170, d_state=64),
    "Simple-S4": dict(block="simple", primitive="s4", d_model=170, d_state=64),
}


def table3_rows() -> list[dict]:
    from longrange.models import ModelConfig, build_model, parameter_report

    rows = []
    for name, kw in TABLE3.items():
        model = build_model(ModelConfig(n_layers=6, **kw), input_kind="numeric", d_input=3, head="classify", n_out=10)
        rows.append({"model": name, **parameter_report(model)})
    return rows


def state_text(state: int | None) -> str:
    """A state size for tables: ``8.2k``; ``-`` for a model that does not generate (bidirectional)."""
    if state is None:
        return "-"
    return f"{state / 1000:.1f}k" if state >= 1000 else str(state)


def format_rows(rows: list[dict]) -> str:
    """A markdown table; rows with an ``architecture`` (presets) get a column for it."""
    described = any("architecture" in r for r in rows)
    stated = any("state" in r for r in rows)
    lines = [
        "| model | total | in primitives | % in primitives |"
        + (" state |" if stated else "")
        + (" architecture |" if described else ""),
        "|---|---:|---:|---:|" + ("---:|" if stated else "") + ("---|" if described else ""),
    ]
    for r in rows:
        line = (
            f"| {r['model']} | {r['total'] / 1000:.1f}k | {r['in_primitives'] / 1000:.1f}k | {100 * r['share']:.0f}% |"
        )
        if stated:
            line += f" {state_text(r.get('state'))} |"
        lines.append(line + (f" {r.get('architecture', '')} |" if described else ""))
    return "\n".join(lines)


def layer_rows_text(name: str, rows: list[dict]) -> str:
    """A model's layers as a markdown table: name in the stack, parameters, state."""
    lines = [f"{name}:", "| layer | name | params | in primitives | state |", "|---:|---|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['layer']} | {r['name']} | {r['params']:,} | {r['in_primitives']:,} | {state_text(r.get('state'))} |"
        )
    lines.append(f"| | all layers | {sum(r['params'] for r in rows):,} | {sum(r['in_primitives'] for r in rows):,} | |")
    return "\n".join(lines)


def preset_row(name: str, vocab: int | None = None, overrides: list[str] | None = None) -> dict:
    """The parameter counts of a preset's (finetuning) model (see ``experiment/params.py``)."""
    from longrange.experiment.config import resolve
    from longrange.experiment.params import model_size

    exp = resolve(name, overrides=overrides or [])
    return {"model": name, **model_size(exp, vocab), "architecture": exp.model.describe()}


def match_text(named: list, target_name: str, target: int, field: str, vocab: int | None) -> str:
    """The value of ``field`` for each cell whose size is closest to ``target`` parameters, as a table."""
    from longrange.experiment.params import match_field

    lines = [
        f"target: {target_name}, {target:,} parameters",
        f"| model | {field} | total | vs target | setting |",
        "|---|---:|---:|---:|---|",
    ]
    for cell in named:
        found = match_field(cell.exp, target, field, vocab)
        lines.append(
            f"| {cell.name} | {found.before} -> {found.value} | {found.total:,} | {found.off:+.1%} | "
            f"`{field}={found.value}` |"
        )
    return "\n".join(lines)


def _params(args: argparse.Namespace) -> int:
    from longrange.experiment.cells import named_cells
    from longrange.experiment.cli import data_settings
    from longrange.experiment.config import resolve
    from longrange.experiment.params import layer_sizes, model_size

    settings = data_settings(args, args.settings)
    if not (args.preset or args.config):
        if args.settings or args.match:
            raise ConfigError("give the models to count with --preset (repeatable) or --config")
        print(format_rows(table3_rows()))
        return 0
    named = named_cells(args.preset or [], args.config or [], settings)
    if args.match:
        target = int(model_size(resolve(args.match, overrides=data_settings(args, [])), args.vocab)["total"])
        print(match_text(named, args.match, target, args.vary, args.vocab))
        return 0
    print(
        format_rows(
            [
                {"model": cell.name, **model_size(cell.exp, args.vocab), "architecture": cell.exp.model.describe()}
                for cell in named
            ]
        )
    )
    if args.per_layer:
        for cell in named:
            print()
            print(layer_rows_text(f"{cell.name} ({cell.exp.model.name})", layer_sizes(cell.exp, args.vocab)))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from longrange.experiment.cli import add_data_args

    p = sub.add_parser(
        "params",
        help="parameter counts, in total and inside the sequence primitives (default: the "
        "thesis' Table 3 models); --match finds the width that matches another model's count",
        description="Counts the supervised model of each cell: each --preset x each --config x each "
        "combination of swept values (FIELD=A,B), as `longrange compare` builds them.",
    )
    p.add_argument(
        "--preset",
        action="append",
        help="a built-in preset or a YAML experiment file (repeatable); token "
        "tasks with a data-dependent vocabulary (text, retrieval) load their data unless --vocab is given",
    )
    p.add_argument("--config", action="append", help="a YAML file applied on top of each preset (repeatable)")
    p.add_argument(
        "--match",
        metavar="PRESET",
        help="find, for each model, the value of --vary whose parameter count "
        "is closest to this preset's (or YAML file's)",
    )
    p.add_argument(
        "--vary",
        metavar="FIELD",
        default="model.d_model",
        help="the integer field --match adjusts (default model.d_model)",
    )
    p.add_argument(
        "--per-layer",
        action="store_true",
        help="also each model's layers: name in its stack, parameters and state per layer",
    )
    p.add_argument(
        "--vocab", type=int, default=None, help="vocabulary size of a token task (instead of loading its data)"
    )
    add_data_args(p)  # --data-dir, --skip-bad for the presets' task data
    p.add_argument(
        "settings",
        nargs="*",
        metavar="FIELD=VALUE",
        help="overrides of every model, e.g. model.d_model=128; FIELD=A,B counts a model per value",
    )
    p.set_defaults(func=_params)
