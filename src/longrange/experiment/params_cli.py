"""``longrange params``: parameter counts of models, in total and inside the sequence primitives.

The default table is the thesis' Table 3; ``--preset`` counts the model of an experiment preset
(which needs the preset's task data for the vocabulary size).
"""
from __future__ import annotations

import argparse

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


def format_rows(rows: list[dict]) -> str:
    """A markdown table; rows with an ``architecture`` (presets) get a column for it."""
    described = any("architecture" in r for r in rows)
    lines = ["| model | total | in primitives | % in primitives |" + (" architecture |" if described else ""),
             "|---|---:|---:|---:|" + ("---|" if described else "")]
    for r in rows:
        line = f"| {r['model']} | {r['total'] / 1000:.1f}k | {r['in_primitives'] / 1000:.1f}k | {100 * r['share']:.0f}% |"
        lines.append(line + (f" {r.get('architecture', '')} |" if described else ""))
    return "\n".join(lines)


def fixed_vocabulary(task: str, options: dict):
    """The vocabulary of a token task that does not depend on its data (else None)."""
    from longrange.data.tasks import get_spec

    if get_spec(task, **options).input_kind != "tokens":
        return None
    if task == "listops":
        from longrange.data.listops import listops_vocabulary

        return listops_vocabulary()
    if task in ("image", "pathfinder", "path-x", "path-x-256"):
        from longrange.data.image import level_vocabulary

        return level_vocabulary()
    if task == "species":
        from longrange.data.species import ALPHABET
        from longrange.data.tokenize import Vocabulary

        return Vocabulary(list(ALPHABET), strict=True)
    return None  # text, retrieval: the characters of the training data


def preset_row(name: str, vocab: int | None = None, overrides: list[str] | None = None) -> dict:
    """The parameter counts of a preset's (finetuning) model. Token tasks need the vocabulary:
    its size ``vocab`` if given, else the task's fixed vocabulary, else the task's data is loaded.
    The model is built on the meta device (shapes only), so even large presets count instantly."""
    import torch

    import longrange.data  # noqa: F401  (registers the tasks)
    from longrange.data.tasks import get_spec
    from longrange.experiment.config import resolve
    from longrange.objectives.factory import supervised_head
    from longrange.models import build_model, parameter_report

    exp = resolve(name, overrides=overrides or [])
    spec = get_spec(exp.task.name, **exp.task.options)
    vocab_size, tokens = None, None
    if spec.input_kind == "tokens" and vocab:
        vocab_size = vocab
    elif spec.input_kind == "tokens":
        vocabulary = fixed_vocabulary(exp.task.name, exp.task.options)
        if vocabulary is None:
            from longrange.experiment.taskdata import load_data

            vocabulary = load_data(exp.task).vocab  # a missing data set is an error naming its files
        vocab_size, tokens = len(vocabulary), vocabulary.tokens
    head, n_out = supervised_head(spec)
    with torch.device("meta"):
        model = build_model(exp.model, input_kind=spec.input_kind, head=head, n_out=n_out,
                            vocab_size=vocab_size, d_input=spec.d_input, vocab=tokens)
    return {"model": name, **parameter_report(model), "architecture": exp.model.describe()}


def _params(args: argparse.Namespace) -> int:
    from longrange.experiment.cli import data_settings

    rows = table3_rows() if not args.preset else [
        preset_row(name, args.vocab, data_settings(args, [])) for name in args.preset
    ]
    print(format_rows(rows))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from longrange.experiment.cli import add_data_args

    p = sub.add_parser("params", help="parameter counts, in total and inside the sequence primitives (default: the thesis' Table 3 models)")
    p.add_argument("--preset", action="append", help="count the model of a preset instead (repeatable); token tasks with a "
                   "data-dependent vocabulary (text, retrieval) load their data unless --vocab is given")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size of a token task (instead of loading its data)")
    add_data_args(p)  # --data-dir, --skip-bad for the presets' task data
    p.set_defaults(func=_params)
