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
    lines = ["| model | total | in primitives | % in primitives |", "|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['total'] / 1000:.1f}k | {r['in_primitives'] / 1000:.1f}k | {100 * r['share']:.0f}% |")
    return "\n".join(lines)


def _params(args: argparse.Namespace) -> int:
    rows = table3_rows() if not args.preset else []
    for name in args.preset or []:
        from longrange.experiment.config import resolve
        from longrange.experiment.runs import load_data, supervised_head
        from longrange.models import build_model, parameter_report

        exp = resolve(name)
        data = load_data(exp.task)  # the vocabulary size of token tasks comes from the data
        head, n_out = supervised_head(data.spec)
        model = build_model(exp.model, input_kind=data.spec.input_kind, head=head, n_out=n_out,
                            vocab_size=data.vocab_size, d_input=data.spec.d_input)
        rows.append({"model": name, **parameter_report(model)})
    print(format_rows(rows))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("params", help="parameter counts, in total and inside the sequence primitives (default: the thesis' Table 3 models)")
    p.add_argument("--preset", action="append", help="count the model of a preset instead (repeatable; loads its task data)")
    p.set_defaults(func=_params)
