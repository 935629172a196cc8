"""The public namespaces: every package's ``__all__`` resolves, and every ``longrange`` name that
README.md and docs/*.md use exists (code blocks and inline mentions), so docs and exports cannot drift."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGES = ["ops", "layers", "blocks", "models", "objectives", "data", "train", "report", "experiment", "bench"]

_CODE_BLOCK = re.compile(r"```python\n(.*?)```", re.S)
_FROM_IMPORT = re.compile(r"\bfrom (longrange(?:\.\w+)*) import ([\w, ]+)")
_DOTTED = re.compile(r"\blongrange(?:\.[A-Za-z_]\w*)+")


def resolve(dotted: str) -> object:
    """The object a dotted ``longrange...`` name refers to: its longest importable module, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError as err:
            if err.name is None or not ".".join(parts[:i]).startswith(err.name):
                raise
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def names_used_in(text: str) -> set[str]:
    names = set()
    for block in _CODE_BLOCK.findall(text):
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "longrange":
                names |= {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                names |= {a.name for a in node.names if a.name.split(".")[0] == "longrange"}
    for module, imported in _FROM_IMPORT.findall(text):
        names |= {f"{module}.{n.strip()}" for n in imported.split(",") if n.strip()}
    names |= {m.rstrip(".") for m in _DOTTED.findall(text)}
    return names


@pytest.mark.parametrize("package", PACKAGES)
def test_all_names_resolve(package):
    module = importlib.import_module(f"longrange.{package}")
    assert module.__doc__ and module.__doc__.strip(), f"longrange.{package} has no docstring"
    for name in module.__all__:
        assert getattr(module, name) is not None, f"longrange.{package}.{name}"
    assert set(module.__all__) <= set(dir(module))


def test_documented_imports():
    from longrange.ops import selective_scan  # noqa: F401
    from longrange.report import write_report
    from longrange.report.writer import write_report as written

    assert write_report is written


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_longrange_name_in_the_docs_exists(doc):
    names = names_used_in(doc.read_text())
    missing = []
    for name in sorted(names):
        try:
            resolve(name)
        except (ImportError, AttributeError) as err:
            missing.append(f"{name}: {err}")
    assert not missing, f"{doc.name} names what does not exist:\n" + "\n".join(missing)


def test_the_scan_finds_names_and_misses():
    text = (
        "Use `longrange.data.load_task(name)`.\n```python\nfrom longrange.models import (\n    ModelConfig,\n)\n```\n"
        "and from longrange.ops import fft_conv, nothing_here"
    )
    assert names_used_in(text) == {
        "longrange.data.load_task",
        "longrange.models.ModelConfig",
        "longrange.ops.fft_conv",
        "longrange.ops.nothing_here",
        "longrange.models",
        "longrange.ops",
    }
    with pytest.raises(AttributeError):
        resolve("longrange.ops.nothing_here")
    assert resolve("longrange.data.load_task").__name__ == "load_task"
