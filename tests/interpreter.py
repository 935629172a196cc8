"""Triton's interpreter for a test: ``interpreter.use(monkeypatch)`` sets ``TRITON_INTERPRET=1`` for
the test, or skips it, saying why, where the interpreter cannot run the toolkit's kernels
(:func:`longrange.ops._lazy_kernels.interpreter_problem`: Triton 3.6's with NumPy 2.4 or later)."""

from __future__ import annotations

import pytest


def use(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    from longrange.ops._lazy_kernels import interpreter_problem

    if (why := interpreter_problem()) is not None:
        pytest.skip(why)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
