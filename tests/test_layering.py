"""The layers of the package: no module imports from a layer above its own.

    ops < layers < blocks < models;   data (may use ops) is independent of layers, blocks, models;
    objectives < train < experiment < report, bench < the command line

Imports are read with ``ast`` from every module, including imports inside functions (a lazy
import is still a dependency). The single modules at the package's root (``errors``,
``registry``, ...) are the base that every layer may use; they import only each other. The command
modules (those of ``longrange.cli.COMMAND_MODULES``, any ``cli.py``, ``*_cli.py``, ``__main__.py``)
and the demo sit at the top, whatever package holds them: they wire everything together.
"""
from __future__ import annotations

import ast
from pathlib import Path

import longrange
from longrange.cli import COMMAND_MODULES

SRC = Path(longrange.__file__).parent


def base_modules(src: Path) -> set[str]:
    """Modules every layer may import: the package itself and the single modules at its root
    (errors, registry, optional imports, ...), except the command modules."""
    root = {f"longrange.{p.stem}" for p in src.glob("*.py") if p.stem != "__init__"}
    return {"longrange"} | {name for name in root if not is_top_level(name)}


_BELOW_OBJECTIVES = {"ops", "layers", "blocks", "models", "data"}
#: For each package, the packages its modules may import (besides their own package and BASE).
ALLOWED: dict[str, set[str]] = {
    "ops": set(),
    "layers": {"ops"},
    "blocks": {"ops", "layers"},
    "models": {"ops", "layers", "blocks"},
    "data": {"ops"},
    "objectives": _BELOW_OBJECTIVES,
    "train": _BELOW_OBJECTIVES | {"objectives"},
    "experiment": _BELOW_OBJECTIVES | {"objectives", "train"},
    "report": _BELOW_OBJECTIVES | {"objectives", "train", "experiment"},
    "bench": _BELOW_OBJECTIVES | {"objectives", "train", "experiment", "report"},
}
TOP_LEVEL = {"longrange.experiment.demo"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def is_top_level(name: str) -> bool:
    last = name.rsplit(".", 1)[-1]
    return name in TOP_LEVEL or name in COMMAND_MODULES or last in ("cli", "__main__") or last.endswith("_cli")


BASE = base_modules(SRC)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every ``longrange`` import in the file, with ``from longrange import x`` as longrange.x."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "longrange"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "longrange":
            if node.module == "longrange":
                out += [(node.lineno, f"longrange.{a.name}") for a in node.names if a.name != "__version__"]
            else:
                out.append((node.lineno, node.module))
    return out


def package_of(module: str) -> str | None:
    """The layer package of a module (``longrange.models.heads`` -> "models"), None for base modules."""
    if module in BASE:
        return None
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def violations() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        name = module_name(path)
        if is_top_level(name):
            continue
        own = package_of(name)
        if own is None:  # a base module imports only base modules
            allowed: set[str] = set()
        else:
            assert own in ALLOWED, f"{name}: package {own!r} has no place in the layering; add it to ALLOWED"
            allowed = ALLOWED[own] | {own}
        for line, target in imported_modules(path):
            if target in BASE:
                continue
            if is_top_level(target) or package_of(target) not in allowed:
                found.append(f"{path.relative_to(SRC.parent)}:{line}: {name} imports {target}")
    return found


def test_no_module_imports_from_a_higher_layer():
    assert violations() == []


def test_the_check_sees_a_violation(tmp_path, monkeypatch):
    bad = tmp_path / "longrange" / "ops" / "bad.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("def f():\n    from longrange.models.model import build_model\n")
    assert imported_modules(bad) == [(2, "longrange.models.model")]
    assert package_of("longrange.models.model") not in ALLOWED["ops"]
    monkeypatch.setattr(__import__(__name__), "SRC", tmp_path / "longrange")
    (tmp_path / "longrange" / "errors.py").write_text("from longrange.ops import bad\n")
    monkeypatch.setattr(__import__(__name__), "BASE", base_modules(tmp_path / "longrange"))
    assert BASE >= {"longrange", "longrange.errors"}
    assert violations() == [
        "longrange/errors.py:1: longrange.errors imports longrange.ops",
        "longrange/ops/bad.py:2: longrange.ops.bad imports longrange.models.model",
    ]
