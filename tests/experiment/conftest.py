"""Fixtures shared by the experiment tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_listops_dir(tmp_path_factory):
    """A data directory with a tiny generated ListOps (64/16/16 sequences of 8-24 tokens)."""
    from longrange.data.generate.listops import generate

    root = tmp_path_factory.mktemp("data")
    generate(
        root / "listops",
        n_train=64,
        n_val=16,
        n_test=16,
        min_length=8,
        max_length=24,
        max_depth=3,
        max_args=3,
        seed=0,
        quiet=True,
    )
    return root
