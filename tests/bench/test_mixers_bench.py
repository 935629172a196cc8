"""The matrix-state benchmark's pieces: its SSD baseline computes SSD, its layers build, its
measurements run (tiny sizes; no timing is asserted)."""

from __future__ import annotations

import pytest
import repo_scripts
import torch

from longrange.bench import mixers
from longrange.ops.matrix_state.ssd import ssd_naive


def test_the_minimal_ssd_baseline_computes_ssd():
    inputs = {k: v.double() for k, v in mixers.op_inputs("ssd", batch=2, length=24, heads=3, dk=5, dv=4).items()}
    torch.testing.assert_close(mixers.ssd_minimal(**inputs, chunk_size=8), ssd_naive(**inputs), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", list(mixers.LAYERS))
def test_every_layer_builds_and_is_measured(name):
    row = mixers.measure_layer(name, length=16, batch=1, d=64, warmup=0, batches=1, threads=1)
    assert row["params"] > 0 and row["forward_s"] > 0 and row["fwdbwd_s"] > 0


@pytest.mark.parametrize("op", mixers.OPS)
def test_every_op_is_measured_by_its_forms(op):
    for impl in ("chunk", "naive") + (("minimal",) if op == "ssd" else ()):
        row = mixers.measure_op(
            op, impl, length=16, batch=1, heads=2, dk=8, dv=8, chunk_size=8, warmup=0, batches=1, threads=1
        )
        assert row["fwdbwd_s"] > 0


def test_the_script_prints_its_tables(capsys, monkeypatch):
    script = repo_scripts.load("benchmarks/matrix_state.py", "matrix_state_script")
    monkeypatch.setattr(script.measure, "run_isolated", lambda target, kwargs, timeout=None: _fake(target, kwargs))
    assert script.main(["all", "--lengths", "64,128", "--layers", "gla,attention", "--naive-length", "32"]) == 0
    out = capsys.readouterr().out
    assert "| gla | faster than attention" not in out and "| gla | 128 |" in out
    assert "| ssd | 32 | 1.000 | 30.000 | 30.0x |" in out
    assert "speed-up over ssd_minimal" in out


def _fake(target: str, kwargs: dict) -> dict:
    if target.endswith("measure_layer"):
        slow = kwargs["name"] == "attention" and kwargs["length"] > 64
        return {
            "layer": kwargs["name"],
            "length": kwargs["length"],
            "params": 10,
            "forward_s": 1.0,
            "fwdbwd_s": 3.0 if slow else 2.0,
            "fwdbwd_peak_mb": 1.0,
        }
    return {
        **{key: kwargs[key] for key in ("heads", "dk", "dv") if key in kwargs},
        "op": kwargs["op"],
        "impl": kwargs["impl"],
        "length": kwargs["length"],
        "fwdbwd_s": {"chunk": 1.0, "naive": 30.0, "minimal": 2.0, "numba": 0.5}[kwargs["impl"]],
    }


def test_the_small_part_compares_the_delta_rules_kernels_with_their_chunks(capsys, monkeypatch):
    script = repo_scripts.load("benchmarks/matrix_state.py", "matrix_state_script")
    calls = []
    monkeypatch.setattr(
        script.measure,
        "run_isolated",
        lambda target, kwargs, timeout=None: calls.append(kwargs) or _fake(target, kwargs),
    )
    assert script.main(["small", "--small-shapes", "8x8x16,4x64x64"]) == 0
    assert {(c["op"], c["impl"], c["dk"], c["dv"], c["chunk_size"]) for c in calls} == {
        (op, impl, dk, dv, None)
        for op in ("ssd", "gla", "delta_rule", "gated_delta_rule")
        for impl in ("chunk", "numba")
        for dk, dv in ((8, 16), (64, 64))
    }
    out = capsys.readouterr().out
    assert "| gated_delta_rule | 8 x 8 x 16 | 128 | 1000.0 | 500.0 | 2.00x |" in out


@pytest.mark.parametrize("op", ["ssd", "gla", "delta_rule", "gated_delta_rule"])
def test_the_numba_kernels_and_default_chunks_are_measured(op):
    for impl in ("numba", "chunk"):
        row = mixers.measure_op(op, impl, length=16, batch=1, heads=2, dk=4, dv=4, chunk_size=None, warmup=0, batches=1)
        assert row["fwdbwd_s"] > 0


def test_the_naive_part_measures_the_ops_named_and_refuses_others(capsys, monkeypatch):
    script = repo_scripts.load("benchmarks/matrix_state.py", "matrix_state_script")
    calls = []
    monkeypatch.setattr(
        script.measure,
        "run_isolated",
        lambda target, kwargs, timeout=None: calls.append(kwargs) or _fake(target, kwargs),
    )
    assert script.main(["naive", "--ops", "mamba3_mimo", "--naive-length", "32"]) == 0
    assert {(c["op"], c["impl"]) for c in calls} == {("mamba3_mimo", "chunk"), ("mamba3_mimo", "naive")}
    assert "| mamba3_mimo | 32 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        script.main(["naive", "--ops", "mamba4"])
    assert "unknown ops ['mamba4']" in capsys.readouterr().err


def test_mimo_chunks_count_rank_positions():
    row = mixers.measure_op(
        "mamba3_mimo", "chunk", length=16, batch=1, heads=2, dk=8, dv=8, chunk_size=64, warmup=0, batches=1
    )
    assert row["chunk_size"] == 64 // mixers.MIMO_RANK
