"""The code base passes its linter and formatter (ruff, pinned in the ``dev`` extra; its rules are in
``pyproject.toml``): a change that breaks either fails the suite, and so CI. Run ``ruff check --fix``
and ``ruff format`` to mend most findings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ["src", "tests", "benchmarks", "tools"]

pytest.importorskip("ruff", reason="ruff is not installed (pip install -e '.[dev]')")


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--no-cache", *FOLDERS], cwd=ROOT, capture_output=True, text=True
    )


def test_ruff_finds_nothing_to_lint():
    proc = _ruff("check")
    assert proc.returncode == 0, f"ruff check (run `ruff check --fix` to mend what it can):\n{proc.stdout}{proc.stderr}"


def test_the_code_is_formatted():
    proc = _ruff("format", "--check")
    assert proc.returncode == 0, f"ruff format --check (run `ruff format` to format):\n{proc.stdout}{proc.stderr}"
