"""The layers of the package: no module imports from a layer above its own.

    ops < layers < blocks < models;   data (may use ops) is independent of layers, blocks, models;
    objectives < train < experiment, report < bench, studies < the command line

Imports are read with ``ast`` from every module, including imports inside functions (a lazy
import is still a dependency). The single modules at the package's root (``errors``,
``registry``, ...) are the base that every layer may use; they import only each other. The command
modules (those of ``longrange.cli.COMMAND_MODULES``, any ``cli.py``, ``*_cli.py``, ``__main__.py``)
and the demo sit at the top, whatever package holds them: they wire everything together.
"""

from __future__ import annotations

import ast
import re
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
    "report": _BELOW_OBJECTIVES | {"objectives", "train"},
    "bench": _BELOW_OBJECTIVES | {"objectives", "train", "experiment", "report"},
    "studies": _BELOW_OBJECTIVES | {"objectives", "train", "experiment", "report"},
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
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.split(".")[0] == "longrange"
        ):
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


# ----------------------------------------------------------------------------- import circles
def _resolve(target: str, modules: set[str]) -> str | None:
    """The module an import names: ``longrange.a.b`` itself, or the closest enclosing module."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def import_graph(src: Path) -> dict[str, set[str]]:
    """Module -> the longrange modules it imports (at the top or inside functions), from the files under ``src``.

    ``from longrange.a import b`` names the module ``longrange.a.b`` when it exists, else ``longrange.a``.
    """
    files = {module_name_in(src, p): p for p in sorted(src.rglob("*.py"))}
    modules = set(files)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [f"{node.module}.{a.name}" for a in node.names]
            for t in targets:
                if t.split(".")[0] == "longrange":
                    found = _resolve(t, modules)
                    if found and found != name and not name.startswith(found + "."):  # a package's own __init__
                        edges.add(found)
        graph[name] = edges
    return graph


def module_name_in(src: Path, path: Path) -> str:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_circles():
    assert import_circles(import_graph(SRC)) == []


def test_the_check_sees_an_import_circle_inside_a_function(tmp_path):
    pkg = tmp_path / "longrange"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "__init__.py").write_text("")
    (pkg / "models" / "a.py").write_text("from longrange.models.b import g\n")
    (pkg / "models" / "b.py").write_text("def g():\n    from longrange.models import a\n")
    (pkg / "models" / "c.py").write_text("from longrange.models import a\n")
    assert import_circles(import_graph(pkg)) == [["longrange.models.a", "longrange.models.b"]]


# ----------------------------------------------------------------------------- run-directory files
#: The module that owns the run directory's layout (the other modules of ``train/rundir/`` import its
#: names too), and the names of its files.
RUN_DIR_MODULE = "longrange.train.rundir.layout"


def run_dir_file_names() -> list[str]:
    from longrange.train.rundir import layout

    return [
        layout.CONFIG_FILE,
        layout.SUMMARY_FILE,
        layout.METRICS_FILE,
        layout.FAILED_FILE,
        layout.LOG_FILE,
        layout.LOCK_FILE,
        layout.LAST_CHECKPOINT,
        layout.BEST_WEIGHTS,
        "best.pt",
    ]


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def file_name_literals(src: Path, names: list[str]) -> list[str]:
    """``path:line: name`` for every string in code (docstrings aside) outside the run-directory
    module that spells a run-directory file name."""
    pattern = re.compile("|".join(rf"(?<![\w.-]){re.escape(n)}(?![\w])" for n in names))
    found = []
    for path in sorted(src.rglob("*.py")):
        if module_name_in(src, path) == RUN_DIR_MODULE:
            continue
        tree = ast.parse(path.read_text(), str(path))
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                match = pattern.search(node.value)
                if match:
                    found.append(f"{path.relative_to(src.parent)}:{node.lineno}: {match.group(0)}")
    return found


def test_run_directory_file_names_are_spelled_only_by_the_run_directory_module():
    assert file_name_literals(SRC, run_dir_file_names()) == []


def test_the_check_sees_a_file_name_spelled_elsewhere(tmp_path):
    pkg = tmp_path / "longrange"
    (pkg / "report").mkdir(parents=True)
    (pkg / "report" / "x.py").write_text(
        '"""Reads summary.json (a docstring may name it)."""\n'
        'def f(d):\n    return d / "summary.json", f"{d}/.lock", "my.lock"\n'
    )
    assert file_name_literals(pkg, run_dir_file_names()) == [
        "longrange/report/x.py:3: summary.json",
        "longrange/report/x.py:3: .lock",
    ]
