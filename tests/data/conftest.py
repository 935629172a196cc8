"""Fixtures of the data tests (the writers of tiny data sets are in ``lra_fixtures.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"
