"""docs/config-reference.md is generated from the typed configs (``experiment/config_reference.py``):
the committed page is the generator's output, every field of every config section is on it with its
documentation, and registering a name (a primitive) does not change it."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest

from longrange.experiment import config_reference as R

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "config-reference.md"
#: The modules that define the configuration's sections (every dataclass named ...Config in them is one).
CONFIG_MODULES = (
    "longrange.experiment.config",
    "longrange.models.config",
    "longrange.train.config",
    "longrange.objectives.factory",
)


def test_the_committed_page_is_the_generators_output():
    expected = R.reference()
    committed = PAGE.read_text() if PAGE.is_file() else ""
    assert committed == expected, (
        f"{PAGE.relative_to(ROOT)} is not what the typed configs generate (a field, its default or its `#:` comment "
        f"changed): regenerate it with `{R.COMMAND}`"
    )


def _config_classes() -> set[type]:
    found = set()
    for name in CONFIG_MODULES:
        module = importlib.import_module(name)
        found |= {
            cls
            for _, cls in inspect.getmembers(module, inspect.isclass)
            if dataclasses.is_dataclass(cls) and cls.__module__ == name and cls.__name__.endswith("Config")
        }
    return found


def _table(page: str, section: R.Section) -> list[str]:
    """The field names of the section's table on the page, in order."""
    heading = f"## {R._title(section.name)}\n"
    assert heading in page, f"no heading {heading.strip()!r}"
    text = page.split(heading, 1)[1].split("\n## ", 1)[0]
    return [line.split("`")[1] for line in text.splitlines() if line.startswith("| `")]


def test_every_field_of_every_section_is_on_the_page_with_its_documentation():
    sections = R.sections()
    classes = {s.cls for s in sections if s.cls is not None}
    from longrange.experiment.config import ExperimentConfig

    assert _config_classes() - {ExperimentConfig} <= classes, "a config section missing from the reference"
    page = PAGE.read_text()
    for section in sections:
        cls = section.cls or ExperimentConfig
        fields = [f.name for f in dataclasses.fields(cls) if f.init]
        assert _table(page, section) == fields + (["base"] if section.cls is None else []), section.name
        undocumented = [f"{section.name or 'top level'}.{f.name}" for f in section.fields if not f.doc.strip()]
        assert not undocumented, f"fields without a `#:` comment above them: {undocumented}"
    # every section a field holds has a table of its own, linked from the field
    names = {s.name for s in sections}
    for section in sections:
        for f in section.fields:
            assert f.section is None or f.section in names


def test_choices_come_from_the_checks_and_registered_names_from_longrange_list():
    page = R.reference()
    from longrange.train.config import SCHEDULES

    line = next(x for x in page.splitlines() if x.startswith("| `schedule` |"))
    assert "Allowed: " + ", ".join(f"`{s}`" for s in SCHEDULES) in line
    line = next(x for x in page.splitlines() if x.startswith("| `primitive` |"))
    assert "Registered names: `longrange list primitives` (plugins included)" in line


def test_registering_a_primitive_leaves_the_page_unchanged():
    from longrange.layers.base import SequencePrimitive
    from longrange.models.registry import PRIMITIVES

    before = R.reference()

    class Identity(SequencePrimitive):
        def __init__(self, d_model: int):
            super().__init__()

        def forward(self, x, mask=None):
            return x

    PRIMITIVES.register("reference-test-identity", Identity)
    try:
        assert R.reference() == before
    finally:
        PRIMITIVES.unregister("reference-test-identity")


def test_field_docs_are_the_hash_colon_comments_right_above_each_field():
    @dataclasses.dataclass
    class Example:
        #: One line.
        a: int = 1
        # a note in the code, not documentation
        b: int = 2
        #: Two
        #: lines.
        c: str = "x"

        d: list = dataclasses.field(default_factory=list)

    assert R.field_comments(Example) == {"a": "One line.", "b": "", "c": "Two lines.", "d": ""}


@pytest.mark.parametrize(
    "value, text",
    [
        (None, "null"),
        (True, "true"),
        (1e-8, "1e-08"),
        ("", "''"),
        ("mamba", "mamba"),
        ((0.9, 0.999), "[0.9, 0.999]"),
        ({}, "{}"),
        ({"config": "short"}, "{config: short}"),
    ],
)
def test_defaults_are_written_as_yaml(value, text):
    assert R._value(value) == text


def test_the_command_writes_the_page(tmp_path, capsys):
    out = tmp_path / "ref.md"
    assert R.main([str(out)]) == 0
    assert out.read_text() == R.reference()
    assert R.main([]) == 0 and capsys.readouterr().out == R.reference()
