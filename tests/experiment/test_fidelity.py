"""Fidelity of the presets to the published configurations.

``src/longrange/presets/_fidelity.yaml`` lists, for every preset, each published field: the value
the source gives, where (file and line, or paper section), and our value where it differs with the
reason (its format: ``longrange.experiment.fidelity``). These tests resolve every preset and
compare each listed field, so a preset edited away from its source (or a source entry edited
without the preset) fails; a preset without an entry fails too. ``docs/fidelity.md`` (the
differences, by preset family) is generated from the same file, and ``longrange presets
--fidelity NAME`` prints one preset's every field:

    PYTHONPATH=src python tests/experiment/test_fidelity.py --write      # regenerate docs/fidelity.md

Dotted paths: ``model.X`` (the finetuning/scratch model; ``norm`` and ``prenorm`` resolved to the
block's defaults where unset, ``primitive_options.X`` to the primitive's), ``pretrain_model.X``
(the pretraining model), ``train.X`` / ``pretrain.X`` / ``finetune.X`` (the stages' TrainConfig), ``task.name``,
``task.options.X`` and ``pretrain_task.options.X`` (with the task's defaults), ``objective.X``
(``objective.mask_ratio`` falls back to the task's default), ``compare.X``; deeper keys index into
dicts (``model.primitive_options.l_max``) and, by number, into lists (a hybrid stack's layer as written:
``model.layers.1.options.use_gate``).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

import pytest

import longrange.data  # noqa: F401  (registers the tasks)
from longrange.data.tasks import get_spec, task_options
from longrange.experiment.config import ExperimentConfig, list_presets, resolve
from longrange.experiment.fidelity import (
    WRITE_COMMAND,
    differences_page,
    differs,
    entry_cells,
    entry_key,
    expand,
    family_papers,
    load_fidelity,
    preset_listing,
    same,
)
from longrange.models.registry import PRIMITIVES

DOC = Path(__file__).resolve().parents[2] / "docs" / "fidelity.md"
ENTRY_KEYS = {"field", "name", "published", "as", "ours", "at", "why"}
PRESET_KEYS = {"row", "note", "include", "fields"}
_MISSING = object()


# --------------------------------------------------------------------------- field values
def _walk(value: Any, keys: list[str], path: str) -> Any:
    for key in keys:
        if dataclasses.is_dataclass(value):
            value = getattr(value, key, _MISSING)
        elif isinstance(value, dict):
            value = value.get(key, _MISSING)
        elif isinstance(value, list) and key.isdigit():  # a hybrid stack's layer: model.layers.1.options.X
            value = value[int(key)] if int(key) < len(value) else _MISSING
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
    for where, entries in [
        *((f"shared {k}", v) for k, v in DATA["shared"].items()),
        *((f"preset {k}", v.get("fields") or []) for k, v in DATA["presets"].items()),
    ]:
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
    stack = resolve("zoology/mqar/deltanet")  # a hybrid stack's layers, by number
    assert field_value(stack, "model.layers.1.options.use_gate") is False
    assert field_value(stack, "model.layers.0.primitive") == "base-conv"
    with pytest.raises(KeyError, match="no '2'"):
        field_value(stack, "model.layers.2.primitive")
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
    (
        "train.schedule",
        "rsqrt",
        (
            "no rsqrt",
            "approximated by a cosine",
            "the peak of that schedule",
            "the value that schedule reaches",
            "a linear warmup over all",
        ),
    ),
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
    texts += [
        (f"preset {k}: {entry_key(e)}", e.get("why", ""))
        for k, v in data["presets"].items()
        for e in v.get("fields") or []
    ]
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
    planted = {
        "shared": {"x": [{"field": "train.schedule", "why": "no rsqrt schedule: a cosine instead"}]},
        "presets": {},
    }
    assert stale_limitations(planted, {"p": "Deviation: our S4 does not tie A and B."}) == [
        "shared x: train.schedule says 'no rsqrt', which train.schedule now expresses",
        "description of p says 'does not tie', which model.primitive_options.n_ssm now expresses",
    ]


# ------------------------------------------------------------------------------- the doc
def family_sections(page: str) -> dict[str, str]:
    """The text of each family's section of the page (``## `family/` ...`` up to the next)."""
    parts = re.split(r"^## `([^`]+)/`.*$", page, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def expand_names(cell: str) -> list[str]:
    """The preset names of a page's presets cell: ```a/{b, c}`<br>`d/e``` -> a/b, a/c, d/e."""
    names = []
    for group in cell.split("<br>"):
        group = group.strip().strip("`")
        folder, brace, rest = group.partition("{")
        names += [folder + last.strip() for last in rest.rstrip("}").split(",")] if brace else [group]
    return names


def difference_rows(section: str) -> dict[str, list[str]]:
    """The rows of a family's differences table: the row without its presets cell -> the presets."""
    rows = {}
    for line in section.partition("### Differences in")[2].splitlines()[1:]:
        if line.startswith("| ") and not line.startswith("| field |"):
            head, _, cell = line[:-2].rpartition(" | ")
            rows[head + " |"] = sorted(expand_names(cell))
    return rows


def _row(cells) -> str:
    return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


PAGE = differences_page(DATA)


def test_the_doc_is_generated_from_fidelity_yaml():
    assert DOC.is_file(), f"docs/fidelity.md is missing; run: {WRITE_COMMAND}"
    assert DOC.read_text() == PAGE, f"docs/fidelity.md is out of date; run: {WRITE_COMMAND}"


def test_the_page_lists_every_difference_of_every_preset_and_nothing_the_same():
    sections = family_sections(PAGE)
    assert sorted(sections) == sorted({n.split("/")[0] for n in DATA["presets"]})
    listed = {family: difference_rows(text) for family, text in sections.items()}
    expected: dict[str, dict[str, list[str]]] = {}
    for name in sorted(DATA["presets"]):
        family = name.split("/")[0]
        for entry in expand(DATA, name):
            if differs(entry):
                expected.setdefault(family, {}).setdefault(_row((*entry_cells(entry), entry["why"])), []).append(name)
    for family, rows in listed.items():
        # Every differing entry of every preset, on a row that names the preset; no other row.
        assert rows == expected.get(family, {}), family
    n_same = n_diff = 0
    for name in DATA["presets"]:
        entries = expand(DATA, name)
        n_same += sum(not differs(e) for e in entries)
        n_diff += sum(differs(e) for e in entries)
    assert n_diff == sum(len(p) for rows in listed.values() for p in rows.values()) > 0
    # No row says "same": the same fields are counted, one number per preset.
    assert not re.search(r"\| same \|$", PAGE, re.MULTILINE) and "| preset | reproduces | fields the same |" in PAGE
    assert f"{n_same:,} the same and {n_diff:,} different" in PAGE


def test_the_page_counts_the_same_fields_per_preset_and_keeps_every_note():
    for name, spec in DATA["presets"].items():
        entries = expand(DATA, name)
        n = sum(differs(e) for e in entries)
        counts = f" | {len(entries) - n:,} | {n:,} |" if entries else " |  |  |"
        assert _row((f"`{name}`", spec["row"] or "no published row")) + counts[2:] in PAGE, name
        if spec.get("note"):
            assert f"- `{name}`: {spec['note'].strip()}" in PAGE, name


def test_the_page_groups_by_family_with_its_paper():
    sections = family_sections(PAGE)
    assert list(sections) == sorted(sections)
    assert re.search(r"^## `spt/`: Amos, Berant & Gupta, Never Train from Scratch", PAGE, re.MULTILINE)
    assert re.search(r"^## `demo/`: the settings of `longrange demo`", PAGE, re.MULTILINE)
    papers = family_papers(sorted(DATA["presets"]))
    assert papers["mamba"].startswith("Gu & Dao") and papers["s4"].startswith("Gu, Goel")


def test_the_command_lists_every_field_of_a_preset(capsys):
    from longrange.cli import main

    name = "spt/listops/s4"
    entries = expand(DATA, name)
    assert any(differs(e) for e in entries) and any(not differs(e) for e in entries)
    assert main(["presets", "--fidelity", name]) == 0
    out = capsys.readouterr().out
    assert out == preset_listing(name, DATA)
    for entry in entries:  # the same ones included
        status = entry["why"] if "ours" in entry else "same"
        assert _row((*entry_cells(entry), status)) in out, entry_key(entry)
    n = sum(differs(e) for e in entries)
    assert f"{len(entries)} published fields: {len(entries) - n} the same, {n} differ" in out
    assert "- **SPT-paper**: " in out and "- **LRA**" not in out  # the sources it cites
    # A preset that reproduces no row keeps its note.
    name = next(n for n, spec in DATA["presets"].items() if spec["row"] is None)
    assert DATA["presets"][name]["note"].strip() in preset_listing(name, DATA)


def test_the_command_names_the_closest_presets_for_an_unknown_one(capsys):
    from longrange.cli import main

    assert main(["presets", "--fidelity", "spt/listops/s44"]) == 1
    err = capsys.readouterr().err
    assert "unknown preset 'spt/listops/s44' (did you mean spt/listops/s4" in err
    assert "`longrange presets` lists them" in err
    assert main(["presets", "spt/", "--fidelity", "spt/listops/s4"]) == 1
    assert "--fidelity" in capsys.readouterr().err
    from longrange.errors import ConfigError

    with pytest.raises(ConfigError, match="'spt/listops/s4' has no entry in presets/_fidelity.yaml"):
        preset_listing("spt/listops/s4", {**DATA, "presets": {}})


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {WRITE_COMMAND}")
    DOC.write_text(differences_page(load_fidelity()))
    print(f"wrote {DOC}")
