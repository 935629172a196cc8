"""The experiment file's format, field by field, generated from the typed configs (docs/config-reference.md).

Every section of an experiment is a dataclass (``ExperimentConfig`` and the sections it holds,
``TrainConfig`` for ``train``), and every field carries its documentation as a ``#:`` comment right
above it (the convention Sphinx reads as an attribute's docstring). :func:`reference` walks the
dataclasses from ``ExperimentConfig`` and writes one table per section: each field with its type
(the annotation as declared), its default, its documentation and, where the field is a choice, the
allowed values (from the constants the config checks against). Names that plugins extend (primitives,
blocks, tasks) are not listed: ``longrange list`` prints what is registered, plugins included, so the
page does not change when a primitive is added. ::

    python -m longrange.experiment.config_reference docs/config-reference.md   # write the page
    python -m longrange.experiment.config_reference                           # print it

``tests/experiment/test_config_reference.py`` checks that the committed page is this output and that
every field of every section is in it and documented, so the page cannot drift from the code.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys
import textwrap
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The command that writes the page (said by the test when the committed page differs).
COMMAND = "python -m longrange.experiment.config_reference docs/config-reference.md"

#: Sections whose values are plain mappings in ExperimentConfig, overrides of another section's fields
#: in one stage: section -> the section whose fields it takes.
OVERRIDES = {"pretrain": "train", "finetune": "train", "pretrain_model": "model", "pretrain_task": "task"}

#: How to see the registered names of a field that names a registry entry.
REGISTERED = {
    ("model", "block"): "blocks",
    ("model", "primitive"): "primitives",
    ("task", "name"): "tasks",
}


@dataclass
class Field:
    name: str
    type: str
    default: str
    doc: str
    choices: str
    section: str | None  # the dotted name of the nested section it holds, if it is one


@dataclass
class Section:
    name: str  # dotted: "" (the top level), "task", "compare.launcher", ...
    cls: type | None  # None: the top level (ExperimentConfig)
    intro: str
    fields: list[Field]


def _markdown(text: str) -> str:
    """reStructuredText's inline markup as Markdown: ``x`` -> `x`, :role:`~a.b` -> `a.b`."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def field_comments(cls: type) -> dict[str, str]:
    """The ``#:`` comment right above each field of the dataclass ``cls`` (the lines joined; '' where
    there is none), read from its source. Plain ``#`` comments are notes in the code, not field docs."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    tree = ast.parse(source)
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef)).body
    out: dict[str, str] = {}
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        doc: list[str] = []
        i = node.lineno - 2  # the line above the field (0-based)
        while i >= 0 and lines[i].strip().startswith("#:"):
            doc.insert(0, lines[i].strip()[2:].strip())
            i -= 1
        out[node.target.id] = " ".join(doc)
    return out


def _value(value: Any) -> str:
    """A default as it is written in YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return value if re.fullmatch(r"[A-Za-z0-9_./+-]+", value) else repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def _choices() -> dict[tuple[str, str], str]:
    """The allowed values of the fields that are choices, from the constants the configs check against."""
    from longrange.blocks.norms import NORMS
    from longrange.experiment import config as E
    from longrange.layers.s6 import ROPE_TARGETS
    from longrange.models import config as M
    from longrange.objectives.pretraining import NUMERIC_LOSSES
    from longrange.train import config as T

    def listed(values) -> str:
        return ", ".join(f"`{_value(v)}`" for v in values)

    def one_of(values) -> str:
        return "Allowed: " + listed(values)

    def each_of(values) -> str:
        return "Each entry one of " + listed(values)

    def keys(values) -> str:
        return "Keys: " + listed(values)

    out = {
        ("model", "direction"): one_of(M.DIRECTIONS),
        ("model", "norm"): one_of(NORMS) + ", `null`",
        ("model", "pooling"): one_of(M.POOLINGS),
        ("model", "head_layers"): one_of(M.HEAD_LAYERS),
        ("model", "head_activation"): one_of(M.HEAD_ACTIVATIONS),
        ("model", "init"): one_of(M.INIT_SCHEMES),
        ("model", "pos_embedding"): one_of(M.POSITIONAL),
        ("model", "mlp"): one_of(M.MLPS),
        ("model", "rope_targets"): each_of(ROPE_TARGETS),
        ("model", "hf"): keys(M.HF_KEYS),
        ("train", "schedule"): one_of(T.SCHEDULES),
        ("train", "cycles"): one_of(T.CYCLES),
        ("train", "step_unit"): one_of(T.STEP_UNITS),
        ("train", "precision"): one_of(T.PRECISIONS),
        ("train", "loggers"): each_of(T.LOGGERS),
        ("train", "param_groups"): "Each rule's keys: " + listed(T.PARAM_RULE_FIELDS),
        ("train.wandb", "mode"): one_of(T.WANDB_MODES) + ", or `null`",
        ("objective", "numeric_loss"): one_of(NUMERIC_LOSSES),
        ("compare", "objectives"): each_of(E.SPT_OBJECTIVES),
        ("compare", "pretrain_data"): one_of(E.PRETRAIN_DATA),
        ("compare.launcher", "kind"): one_of(E.LAUNCHERS),
    }
    for (section, name), kind in REGISTERED.items():
        out[(section, name)] = f"Registered names: `longrange list {kind}` (plugins included)"
    return out


def _intro(cls: type) -> str:
    doc = cls.__dict__.get("__doc__") or ""
    if doc.startswith(f"{cls.__name__}("):  # the signature dataclasses write where there is no docstring
        return ""
    return _markdown(inspect.cleandoc(doc))


def _section(name: str, cls: type, choices: dict[tuple[str, str], str], out: list[Section]) -> Section:
    """The section of ``cls`` at the dotted ``name``, and (appended to ``out`` after it) its nested sections."""
    hints = typing.get_type_hints(cls)
    docs = field_comments(cls)
    section = Section(name, cls, _intro(cls), [])
    out.append(section)
    nested = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints[f.name]
        dotted = f"{name}.{f.name}"
        if dataclasses.is_dataclass(tp):
            section.fields.append(Field(f.name, "mapping", "", docs.get(f.name, ""), "", dotted))
            nested.append((dotted, tp))
        else:
            section.fields.append(
                Field(
                    f.name,
                    str(f.type),
                    _value(_default(f)),
                    docs.get(f.name, ""),
                    choices.get((name, f.name), ""),
                    None,
                )
            )
    for dotted, tp in nested:
        _section(dotted, tp, choices, out)
    return section


def sections() -> list[Section]:
    """Every section of an experiment, in the order of the page: the top level, then each section and
    its nested ones, in the order ExperimentConfig declares them."""
    from longrange.experiment.config import ExperimentConfig
    from longrange.train.config import TrainConfig

    choices = _choices()
    hints = typing.get_type_hints(ExperimentConfig)
    docs = field_comments(ExperimentConfig)
    top = Section("", None, "", [])
    out = [top]
    for f in dataclasses.fields(ExperimentConfig):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp) or f.name == "train":
            top.fields.append(Field(f.name, "mapping", "", docs.get(f.name, ""), "", f.name))
            _section(f.name, TrainConfig if f.name == "train" else tp, choices, out)
        elif f.name in OVERRIDES:
            top.fields.append(Field(f.name, "mapping", "{}", docs.get(f.name, ""), "", OVERRIDES[f.name]))
        else:
            top.fields.append(Field(f.name, str(f.type), _value(_default(f)), docs.get(f.name, ""), "", None))
    top.fields.append(
        Field(
            "base",
            "str | list[str]",
            "",
            "The presets this file starts from, merged underneath it in "
            "order (a preset's name, as `longrange presets` lists them); the file's own values win.",
            "",
            None,
        )
    )
    return out


def _slug(title: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", title.lower())
    return text.replace(" ", "-")


def _title(section: str) -> str:
    return f"`{section}`" if section else "The top level"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def reference() -> str:
    """docs/config-reference.md: every section and field of an experiment file."""
    all_sections = sections()
    out = [
        "# Experiment files: every field",
        "",
        f"<!-- Generated from the typed configs by `{COMMAND}`; edit the `#:` comments of the fields, "
        "not this page. -->",
        "",
        "An experiment (a preset, a file given with `--config` or `--preset my_experiment.yaml`, the "
        "configuration a run directory holds) is a YAML mapping of the sections below. Every field is "
        "optional: a field left out takes its default, and a file with `base:` starts from those presets. "
        "Any field can be set on the "
        "command line by its dotted name, as `model.d_model=128 train.lr=3e-4 task.options.seq_len=1024` "
        "(values read as YAML: numbers, `true`/`false`, `null`, lists `[0,1,2]`, mappings `{a: 1}`).",
        "",
        "Each value is converted to its field's type and checked before any data is read; an unknown field "
        "or a value of the wrong type is an error that names the dotted field (and the closest known name). "
        'Types: `int` (also `16.0`, `"16"`), `float` (also `1e-3`), `bool` (`true` or `false`), `str`, '
        "`X | None` (`null` allowed), `list[X]`, `tuple[...]` (written as a list), `dict[str, X]` (a "
        "mapping), `Any` (anything); a section is a mapping of its own fields. Where a description "
        "says None, YAML writes `null`.",
        "",
        "Names that plugins extend (primitives, blocks, heads, objectives, tasks) are not listed here: "
        "`longrange list` prints everything registered, with each entry's options and defaults "
        "(`longrange list primitives`, `longrange list primitive s4d`). A task's own options "
        "(`task.options`) are listed by `longrange data info TASK`, a primitive's "
        "(`model.primitive_options`) by `longrange list primitive NAME`. The presets, and how they "
        "follow their papers: [presets.md](presets.md).",
        "",
        "Sections: " + ", ".join(f"[{_title(s.name)}](#{_slug(_title(s.name))})" for s in all_sections) + ".",
        "",
    ]
    for section in all_sections:
        out += [f"## {_title(section.name)}", ""]
        if section.intro:
            out += [section.intro, ""]
        out += ["| field | type | default | description |", "|---|---|---|---|"]
        for f in section.fields:
            text = _markdown(f.doc)
            if f.section:
                link = f"[{_title(f.section)}](#{_slug(_title(f.section))})"
                text = f"{text} Its fields: {link}." if f.name not in OVERRIDES else f"{text} Any field of {link}."
            if f.choices:
                text = f"{text} {f.choices}."
            default = f"`{_cell(f.default)}`" if f.default else ""
            out.append(f"| `{f.name}` | `{_cell(f.type)}` | {default} | {_cell(text.strip())} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = reference()
    if argv:
        Path(argv[0]).write_text(text)
        print(f"wrote {argv[0]}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
