"""``tests/repo_scripts.py``, the loader of the repository's scripts for their tests."""

from __future__ import annotations

import sys

import pytest
import repo_scripts


def test_a_script_loads_fresh_and_registered_under_its_name(tmp_path):
    script = tmp_path / "count_me.py"
    script.write_text("import dataclasses\nCALLS = []\n@dataclasses.dataclass\nclass Row:\n    x: int\n")
    first = repo_scripts.load(script)
    assert sys.modules["count_me"] is first and first.Row(1).x == 1  # dataclasses find their module
    first.CALLS.append(1)
    second = repo_scripts.load(script, "counted")
    assert second.CALLS == [] and sys.modules["counted"] is second  # executed again, under the name given
    for name in ("count_me", "counted"):
        sys.modules.pop(name)


def test_a_relative_path_is_the_repositorys():
    module = repo_scripts.load("benchmarks/grid_jobs.py")
    assert module.__file__ == str(repo_scripts.REPO / "benchmarks" / "grid_jobs.py")


def test_a_script_that_fails_is_not_left_registered_and_a_non_python_file_is_named(tmp_path):
    broken = tmp_path / "broken_script.py"
    broken.write_text("raise RuntimeError('at import')\n")
    with pytest.raises(RuntimeError, match="at import"):
        repo_scripts.load(broken)
    assert "broken_script" not in sys.modules
    data = tmp_path / "table.csv"
    data.write_text("a,b\n")
    with pytest.raises(ImportError, match="table.csv"):
        repo_scripts.load(data)
