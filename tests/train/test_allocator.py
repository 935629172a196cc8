"""train/allocator.py: glibc's thresholds raised once per process for training on a CPU, the
setting that turns it off, and what happens where there is no glibc."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from longrange.train import allocator


@pytest.fixture
def fresh(monkeypatch):
    """The module as in a new process (nothing applied yet), its mallopt recorded, not called."""
    calls = []

    def mallopt(param, value):
        calls.append((param, value))
        return 1

    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setattr(allocator, "_mallopt", lambda: mallopt)
    monkeypatch.delenv(allocator.ENV, raising=False)
    return calls


def test_both_thresholds_are_raised_once_per_process(fresh):
    assert allocator.keep_freed_memory() == "kept"
    assert fresh == [
        (allocator.M_MMAP_THRESHOLD, allocator.MMAP_THRESHOLD),
        (allocator.M_TRIM_THRESHOLD, allocator.TRIM_THRESHOLD),
    ]
    assert allocator.keep_freed_memory() == "kept" and len(fresh) == 2  # not again
    assert allocator.TRIM_THRESHOLD < 2**31 and allocator.MMAP_THRESHOLD < 2**31  # mallopt takes an int


def test_longrange_malloc_system_leaves_the_allocator_alone(fresh, monkeypatch):
    monkeypatch.setenv(allocator.ENV, "System")
    assert allocator.keep_freed_memory() == "system" and fresh == []


def test_a_bad_setting_is_an_error_naming_the_variable(fresh, monkeypatch):
    monkeypatch.setenv(allocator.ENV, "jemalloc")
    with pytest.raises(ValueError, match="LONGRANGE_MALLOC='jemalloc': expected 'keep' .* or 'system'"):
        allocator.keep_freed_memory()


def test_without_glibc_nothing_is_set(fresh, monkeypatch):
    monkeypatch.setattr(allocator, "_mallopt", lambda: None)
    assert allocator.keep_freed_memory() == "not glibc"


def test_a_refused_threshold_is_an_error_saying_how_to_go_on(fresh, monkeypatch):
    monkeypatch.setattr(allocator, "_mallopt", lambda: lambda param, value: 0)
    with pytest.raises(RuntimeError, match="mallopt refused .* set LONGRANGE_MALLOC=system"):
        allocator.keep_freed_memory()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_glibcs_mallopt_accepts_the_thresholds_in_a_fresh_process():
    code = "from longrange.train import allocator; print(allocator.keep_freed_memory())"
    env = {k: v for k, v in os.environ.items() if k != allocator.ENV}  # the default, whatever this shell sets
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "kept"


def test_training_and_a_dry_run_step_on_a_cpu_keep_freed_memory(fresh, tmp_path):
    from longrange.experiment.config import resolve
    from longrange.experiment.dryrun import prepare_step

    prepare_step(resolve("demo/recall/s4d"), "train", device="cpu", batch_size=2)
    assert len(fresh) == 2
    # the trainer (tests/train/test_environment.py's toy run) on a CPU
    from test_environment import _trainer

    allocator._applied = None
    fresh.clear()
    _trainer(tmp_path / "run", epochs=1)
    assert len(fresh) == 2
