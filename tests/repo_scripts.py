"""The repository's scripts as modules, for the tests of them: ``load("benchmarks/step_ab.py")``.

The scripts in ``benchmarks/`` (and a test file whose helpers another test reuses) are not in a
package, so a test executes them from their file. Every test can ``import repo_scripts``: this folder
is on ``sys.path`` because ``tests/conftest.py`` is in it (pytest's default import mode puts the
folder of a ``conftest.py`` without ``__init__.py`` there).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

#: The repository's root (this file is ``tests/repo_scripts.py``).
REPO = Path(__file__).resolve().parents[1]


def load(path: str | Path, name: str | None = None) -> ModuleType:
    """A fresh module executed from ``path`` (relative to the repository's root, or absolute),
    registered in ``sys.modules`` under ``name`` (default: the file's stem), where the dataclasses and
    pickles of a script look their module up. Each call executes the file again."""
    path = Path(path)
    if not path.is_absolute():
        path = REPO / path
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a Python file that can be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module
