"""Fidelity of the presets to the published configurations.

``src/longrange/presets/_fidelity.yaml`` lists, for every preset, each published field: the value
the source gives, where (file and line, or paper section), and our value where it differs with the
reason. These tests resolve every preset and compare each listed field, so a preset edited away
from its source (or a source entry edited without the preset) fails; a preset without an entry
fails too. ``docs/fidelity.md`` is generated from the same file:

    PYTHONPATH=src python tests/experiment/test_fidelity.py --write      # regenerate docs/fidelity.md

File format (see the header of _fidelity.yaml)::

    sources: {ABBREVIATION: what it stands for}
    shared: {NAME: [entry, ...]}               # entry lists included by several presets
    presets:
      NAME:
        row: the published row (table, task), or null for presets that reproduce no row
        note: optional text
        include: [shared NAME, ...]
        fields: [entry, ...]                   # a field given here replaces an included one

    entry: {field: dotted.path, published: VALUE, as: "how the source writes it",
            ours: VALUE (only where it differs), at: "SOURCE file:line", why: "reason for ours"}
           or, for what no config field expresses, {name: text, published: text, ours: text, at, why}

Dotted paths: ``model.X`` (the finetuning/scratch model; ``norm`` and ``prenorm`` resolved to the
block's defaults where unset, ``primitive_options.X`` to the primitive's), ``pretrain_model.X``
(the pretraining model), ``train.X`` / ``pretrain.X`` / ``finetune.X`` (the stages' TrainConfig), ``task.name``,
``task.options.X`` and ``pretrain_task.options.X`` (with the task's defaults), ``objective.X``
(``objective.mask_ratio`` falls back to the task's default), ``compare.X``; deeper keys index into
dicts (``model.primitive_options.l_max``).
"""
from __future__ import annotations

import dataclasses
import math
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

import longrange.data  # noqa: F401  (registers the tasks)
from longrange.data.tasks import get_spec, task_options
from longrange.experiment.config import ExperimentConfig, list_presets, resolve
from longrange.models.registry import PRIMITIVES

FIDELITY = resources.files("longrange") / "presets" / "_fidelity.yaml"
DOC = Path(__file__).resolve().parents[2] / "docs" / "fidelity.md"
ENTRY_KEYS = {"field", "name", "published", "as", "ours", "at", "why"}
PRESET_KEYS = {"row", "note", "include", "fields"}
_MISSING = object()


def load_fidelity() -> dict[str, Any]:
    data = yaml.safe_load(FIDELITY.read_text())
    assert set(data) == {"sources", "shared", "presets"}, f"fidelity.yaml top-level keys: {sorted(data)}"
    return data


def entry_key(entry: dict[str, Any]) -> str:
    return entry.get("field") or entry["name"]


def expand(data: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The entries of a preset: its includes in order, then its own fields (replacing same keys)."""
    spec = data["presets"][name]
    out: dict[str, dict[str, Any]] = {}
    for shared in spec.get("include") or []:
        assert shared in data["shared"], f"{name}: unknown shared list {shared!r}"
        for entry in data["shared"][shared]:
            out[entry_key(entry)] = entry
    for entry in spec.get("fields") or []:
        out[entry_key(entry)] = entry
    return list(out.values())


# --------------------------------------------------------------------------- field values
def _walk(value: Any, keys: list[str], path: str) -> Any:
    for key in keys:
        if dataclasses.is_dataclass(value):
            value = getattr(value, key, _MISSING)
        elif isinstance(value, dict):
            value = value.get(key, _MISSING)
        else:
            value = _MISSING
        if value is _MISSING:
            raise KeyError(f"{path}: no {key!r}")
    return value


def field_value(exp: ExperimentConfig, path: str) -> Any:
    """The value of a dotted path on a resolved preset (see the module docstring)."""
    head, *rest = path.split(".")
    if head in ("model", "pretrain_model"):
        model = exp.model if head == "model" else exp.stage_model("pretrain")
        if rest in (["norm"], ["prenorm"]):  # unset = the block's default
            return model.resolved_norm if rest == ["norm"] else model.resolved_prenorm
        if rest[:1] == ["primitive_options"]:  # unset = the primitive's default
            defaults = PRIMITIVES.options(model.primitive, 1)
            return _walk({**defaults, **model.primitive_options}, rest[1:], path)
        return _walk(model, rest, path)
    if head in ("train", "pretrain", "finetune"):
        return _walk(exp.train_config(head), rest, path)
    if head in ("task", "pretrain_task"):
        task = exp.stage_task("pretrain" if head == "pretrain_task" else "train")
        if rest == ["name"]:
            return task.name
        if rest[:1] == ["options"]:
            return _walk({**task_options(task.name), **task.options}, rest[1:], path)
        return _walk(task, rest, path)
    if head == "objective":
        if rest == ["mask_ratio"] and exp.objective.mask_ratio is None:
            return get_spec(exp.task.name, **exp.task.options).mask_ratio
        return _walk(exp.objective, rest, path)
    if head == "compare":
        return _walk(exp.compare, rest, path)
    raise KeyError(f"{path}: unknown section {head!r}")


def same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


# --------------------------------------------------------------------------------- tests
DATA = load_fidelity()
PRESETS = list_presets()


def test_every_preset_has_an_entry_and_every_entry_a_preset():
    listed = set(DATA["presets"])
    missing = sorted(set(PRESETS) - listed)
    assert not missing, f"presets without an entry in fidelity.yaml: {missing}"
    unknown = sorted(listed - set(PRESETS))
    assert not unknown, f"fidelity.yaml entries for presets that do not exist: {unknown}"


def test_entries_are_well_formed():
    sources = set(DATA["sources"])
    for where, entries in [*((f"shared {k}", v) for k, v in DATA["shared"].items()),
                           *((f"preset {k}", v.get("fields") or []) for k, v in DATA["presets"].items())]:
        for entry in entries:
            assert set(entry) <= ENTRY_KEYS, f"{where}: unknown keys {set(entry) - ENTRY_KEYS} in {entry}"
            assert ("field" in entry) != ("name" in entry), f"{where}: give field or name: {entry}"
            assert "published" in entry and entry.get("at"), f"{where}: published and at are required: {entry}"
            assert entry["at"].split()[0] in sources, f"{where}: {entry['at']!r} starts with no known source"
            if "name" in entry:
                assert "ours" in entry, f"{where}: {entry['name']!r} needs ours (what we do instead)"
            if "ours" in entry and (("name" in entry) or not same(entry["ours"], entry["published"])):
                assert entry.get("why"), f"{where}: {entry_key(entry)} differs from the source without a why"
            if "field" in entry and "ours" in entry:
                assert not same(entry["ours"], entry["published"]), f"{where}: {entry['field']} ours equals published"
    for name, spec in DATA["presets"].items():
        assert set(spec) <= PRESET_KEYS, f"{name}: unknown keys {set(spec) - PRESET_KEYS}"
        assert "row" in spec, f"{name}: row is required (null for presets that reproduce no published row)"
        if spec["row"] is None:
            assert spec.get("note"), f"{name}: a preset that reproduces no row needs a note saying why"
        else:
            assert expand(DATA, name), f"{name}: a published row needs its fields"


@pytest.mark.parametrize("name", sorted(DATA["presets"]))
def test_preset_matches_its_published_fields(name):
    exp = resolve(name)
    wrong = []
    for entry in expand(DATA, name):
        if "field" not in entry:
            continue
        expected = entry.get("ours", entry["published"])
        try:
            actual = field_value(exp, entry["field"])
        except KeyError as err:
            wrong.append(str(err))
            continue
        if not same(actual, expected):
            wrong.append(f"{entry['field']} = {actual!r}, fidelity.yaml says {expected!r} ({entry['at']})")
    assert not wrong, f"{name}: " + "; ".join(wrong)


def test_field_values_follow_the_dotted_paths():
    exp = resolve("spt/listops/s4")
    assert field_value(exp, "model.primitive_options.l_max") == 2048
    assert field_value(exp, "pretrain.epochs") == 100 and field_value(exp, "train.epochs") == 40
    assert field_value(exp, "objective.mask_ratio") == 0.1  # the task's default
    assert field_value(exp, "task.options.truncate") is False  # a task default
    with pytest.raises(KeyError, match="no 'nope'"):
        field_value(exp, "model.nope")
    assert same(0.1, 0.1 + 1e-15) and not same(0.1, 0.11) and not same(True, 1) and same([1, 2.0], [1.0, 2])


def test_a_drifted_preset_fails():
    exp = resolve("spt/listops/s4", overrides=["train.lr=0.02"])
    entries = {entry_key(e): e for e in expand(DATA, "spt/listops/s4")}
    assert not same(field_value(exp, "train.lr"), entries["train.lr"].get("ours", entries["train.lr"]["published"]))


# ------------------------------------------------------------- limitations the config now expresses
#: Limitations of ours that the record once gave as reasons, each with what now expresses it: a
#: config field (and the value that matters), and phrases that name the limitation. A reason (why)
#: in fidelity.yaml or a preset's description that names one of them again is stale: the preset
#: should use the field instead, and its row becomes "same".
EXPRESSIBLE = [
    ("model.attn_dropout", None, ("attention-probability dropout is not", "attention dropout is not")),
    ("model.output_glu", False, ("always has the glu", "ours is the simple block with linear(h, 2h) + glu")),
    ("model.primitive_options.n_ssm", None, ("does not tie", "our s4 has one per channel", "one a, b per channel")),
    ("model.primitive_options.n_ssm_A", None, ("one a per channel",)),
    ("model.primitive_options.dt_transform", "softplus", ("stores log delta", "ours through exp")),
    ("train.schedule", "rsqrt", ("no rsqrt", "approximated by a cosine", "the peak of that schedule",
                                 "the value that schedule reaches", "a linear warmup over all")),
    ("train.cycles", "periodic", ("not periodic", "ours decays once")),
    ("train.cosine_steps", None, ("our cosine spans the run", "ours at 0", "ours ends at 0")),
    ("task.options.classes", 10, ("35 classes only",)),
    ("model.head_layers", 3, ("retrieval head is always", "head_layers applies to pooled heads only")),
]


def expressible_field(path: str, value: Any) -> bool:
    """Whether a dotted field exists (on the model, training or speech-commands task configuration)
    and takes ``value`` (None: any value) without a configuration error."""
    from longrange.errors import ConfigError
    from longrange.models.config import ModelConfig
    from longrange.train.config import TrainConfig

    head, *rest = path.split(".")
    try:
        if head == "task":
            options = task_options("speech-commands")
            if rest[1] not in options:
                return False
            if value is not None:
                get_spec("speech-commands", **{rest[1]: value})
            return True
        if rest[:1] == ["primitive_options"]:
            return rest[1] in PRIMITIVES.options("s4", 1)
        cls = ModelConfig if head == "model" else TrainConfig
        if rest[0] not in {f.name for f in dataclasses.fields(cls)}:
            return False
        if value is not None:
            extra = {"block": "simple", "primitive": "s4d"} if head == "model" else {}
            cls.from_dict({**extra, rest[0]: value})
        return True
    except ConfigError:
        return False


def stale_limitations(data: dict[str, Any], descriptions: dict[str, str]) -> list[str]:
    """Reasons and descriptions that name a limitation the config now expresses (see EXPRESSIBLE)."""
    found = []
    texts = [(f"shared {k}: {entry_key(e)}", e.get("why", "")) for k, v in data["shared"].items() for e in v]
    texts += [(f"preset {k}: {entry_key(e)}", e.get("why", ""))
              for k, v in data["presets"].items() for e in v.get("fields") or []]
    texts += [(f"description of {k}", text) for k, text in descriptions.items()]
    for where, text in texts:
        low = text.lower()
        for path, _, phrases in EXPRESSIBLE:
            hit = next((p for p in phrases if p in low), None)
            if hit:
                found.append(f"{where} says {hit!r}, which {path} now expresses")
    return found


def test_every_limitation_the_config_expresses_has_its_field():
    for path, value, _ in EXPRESSIBLE:
        assert expressible_field(path, value), f"{path} = {value!r} is not a valid configuration"
    assert not expressible_field("model.no_such_field", None) and not expressible_field("train.schedule", "sqrt")


def test_no_reason_names_a_limitation_the_config_now_expresses():
    descriptions = {name: resolve(name).description for name in PRESETS}
    stale = stale_limitations(DATA, descriptions)
    assert not stale, "stale reasons:\n" + "\n".join(stale)
    # The check does fail on such a reason.
    planted = {"shared": {"x": [{"field": "train.schedule", "why": "no rsqrt schedule: a cosine instead"}]}, "presets": {}}
    assert stale_limitations(planted, {"p": "Deviation: our S4 does not tie A and B."}) == [
        "shared x: train.schedule says 'no rsqrt', which train.schedule now expresses",
        "description of p says 'does not tie', which model.primitive_options.n_ssm now expresses",
    ]


# ------------------------------------------------------------------------------- the doc
def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) + "}"
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(data: dict[str, Any]) -> str:
    lines = [
        "# Fidelity of the presets to the published configurations",
        "",
        "Generated from `src/longrange/presets/_fidelity.yaml` by",
        "`PYTHONPATH=src python tests/experiment/test_fidelity.py --write`; do not edit by hand.",
        "`tests/experiment/test_fidelity.py` resolves every preset and checks each field below, and",
        "fails for a preset without an entry. For every preset: each published field, where it is",
        "published, the source's value, ours, and \"same\" or the reason for the difference. Where a",
        "paper and its code disagree the presets follow the code; both are named.",
        "",
        "Sources:",
        "",
    ]
    for key, text in data["sources"].items():
        lines.append(f"- **{key}**: {text}")
    group = None
    for name in sorted(data["presets"]):
        spec = data["presets"][name]
        top = name.split("/")[0]
        if top != group:
            group = top
            lines += ["", f"## `{group}/`", ""]
        lines += [f"### `{name}`", ""]
        lines.append(f"Reproduces: {spec['row']}." if spec["row"] else "Reproduces no published row.")
        if spec.get("note"):
            lines.append("")
            lines.append(spec["note"].strip())
        entries = expand(data, name)
        if entries:
            lines += ["", "| field | published | where | ours | |", "|---|---|---|---|---|"]
            for e in entries:
                field = f"`{e['field']}`" if "field" in e else e["name"]
                published = _fmt(e["published"]) + (f" ({e['as']})" if e.get("as") else "")
                differs = "ours" in e and ("name" in e or not same(e["ours"], e["published"]))
                ours = _fmt(e["ours"]) if "ours" in e else _fmt(e["published"])
                status = e["why"] if differs else "same"
                lines.append("| " + " | ".join(_cell(x) for x in (field, published, e["at"], ours, status)) + " |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def test_the_doc_is_generated_from_fidelity_yaml():
    assert DOC.is_file(), "docs/fidelity.md is missing; run: PYTHONPATH=src python tests/experiment/test_fidelity.py --write"
    assert DOC.read_text() == render_markdown(DATA), (
        "docs/fidelity.md is out of date; run: PYTHONPATH=src python tests/experiment/test_fidelity.py --write")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: PYTHONPATH=src python tests/experiment/test_fidelity.py --write")
    DOC.write_text(render_markdown(load_fidelity()))
    print(f"wrote {DOC}")
