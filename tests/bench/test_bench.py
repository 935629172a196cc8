"""Benchmark mechanics at tiny sizes: tables, relative columns, memory, budgets, errors, CLI.

No timing is asserted: only that figures exist, are positive and finite, and that the bookkeeping
(relative columns, budget stops, error messages, files written) is right.
"""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

from longrange.bench import generation, measure, scaling
from longrange.bench import models as bench_models
from longrange.bench.cli import format_table, register
from longrange.errors import ConfigError

TINY = dict(batch_size=2, length=16, channels=3, warmup=1, batches=1, device="cpu")
FIGURES = (
    "train_s_per_batch",
    "train_seq_per_s",
    "train_tok_per_s",
    "infer_s_per_batch",
    "infer_seq_per_s",
    "infer_tok_per_s",
)


@pytest.fixture
def tiny_configs(tmp_path):
    """Two tiny model config files (fast to build and run) and their names."""
    paths = {}
    for name, cfg in {
        "tiny-s4d": {"block": "mamba", "primitive": "s4d", "n_layers": 1, "d_model": 8, "d_state": 4},
        "tiny-attn": {
            "model": {"block": "transformer", "primitive": "attention", "n_layers": 1, "d_model": 8, "n_heads": 2}
        },
    }.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(cfg))
        paths[name] = str(path)
    return paths


def _finite_positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_table_has_every_model_positive_figures_and_reference_at_exactly_100(tiny_configs):
    names = [tiny_configs["tiny-s4d"], tiny_configs["tiny-attn"]]
    rows = bench_models.run_bench(names, bench_models.Workload(**TINY), reference=names[1], isolate=False)
    assert [r["model"] for r in rows] == ["tiny-s4d", "tiny-attn"]
    for row in rows:
        assert "error" not in row, row
        assert row["params"] > 0
        for key in FIGURES:
            assert _finite_positive(row[key]), (key, row)
        assert row["train_tok_per_s"] == pytest.approx(row["train_seq_per_s"] * TINY["length"])
        assert row["train_peak_mb"] >= 0 and row["infer_peak_mb"] >= 0
    ref = rows[1]
    assert ref["train_speed_pct"] == 100.0 and ref["infer_speed_pct"] == 100.0
    other = rows[0]
    assert other["train_speed_pct"] == pytest.approx(100.0 * other["train_seq_per_s"] / ref["train_seq_per_s"])


def test_missing_reference_is_measured_and_placed_first(tiny_configs):
    rows = bench_models.run_bench(
        [tiny_configs["tiny-s4d"]], bench_models.Workload(**TINY), reference=tiny_configs["tiny-attn"], isolate=False
    )
    assert [r["model"] for r in rows] == ["tiny-attn", "tiny-s4d"]
    assert rows[0]["train_mem_pct"] in (100.0, None)  # None only if the reference's peak is 0 MB
    assert rows[0]["train_speed_pct"] == 100.0


def test_unknown_model_name_lists_the_valid_ones():
    with pytest.raises(ConfigError) as err:
        bench_models.resolve_model("mamba-s5")
    message = str(err.value)
    assert "'mamba-s5'" in message
    for name in ("mamba-s6", "mamba-s4d-bi", "transformer", "dlr"):
        assert name in message


def test_named_set_has_the_thesis_widths():
    m = bench_models.MODELS
    assert (m["mamba-s6"].config["d_model"], m["mamba-s6"].config["d_state"]) == (116, 16)
    assert (m["simple-s4d"].config["d_model"], m["simple-s4d"].config["d_state"]) == (170, 64)
    assert m["mamba-s6-bi"].config["d_model"] == 107 and m["mamba-s6-bi"].config["direction"] == "bidirectional"
    assert m["mamba-s4d-bi"].config["d_model"] == 108
    assert m["mamba-s6-sm"].config["d_model"] == 170 and m["mamba-s4d-sm"].config["d_model"] == 140
    for name in bench_models.DEFAULT_MODELS:
        assert name in m


def test_bad_model_config_files_name_the_file_and_field(tmp_path):
    bad_field = tmp_path / "bad.yaml"
    bad_field.write_text("block: mamba\nprimitive: s6\nwidth: 12\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*width"):
        bench_models.resolve_model(str(bad_field))
    bad_value = tmp_path / "badvalue.json"
    bad_value.write_text(json.dumps({"primitive": "s5"}))
    with pytest.raises(ConfigError, match=r"badvalue\.json.*model\.primitive"):
        bench_models.resolve_model(str(bad_value))
    broken = tmp_path / "broken.yaml"
    broken.write_text("block: [mamba\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml.*not a readable model config"):
        bench_models.resolve_model(str(broken))
    not_a_mapping = tmp_path / "list.json"
    not_a_mapping.write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"list\.json.*expected a mapping"):
        bench_models.resolve_model(str(not_a_mapping))
    with pytest.raises(ConfigError, match=r"missing\.yaml does not exist"):
        bench_models.resolve_model(str(tmp_path / "missing.yaml"))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"batch_size": 0}, "--batch-size must be positive"),
        ({"warmup": -1}, "--warmup must be >= 0"),
        ({"precision": "float8"}, "--precision 'float8' is unknown"),
        ({"precision": "fp16-mixed"}, "fp16-mixed needs a CUDA device"),
        ({"device": "nonsense"}, "--device 'nonsense'"),
        ({"threads": 0}, "--threads must be positive"),
    ],
)
def test_bad_workload_options_are_named(change, message):
    with pytest.raises(ConfigError, match=message):
        bench_models.Workload(**{**TINY, **change}).validate()


def test_a_model_that_fails_gets_an_error_row_not_a_silent_skip(tiny_configs, monkeypatch):
    real_build = bench_models.build_classifier

    def build(config, channels, n_classes):
        if config.get("block") == "mamba":
            raise RuntimeError("kernel exploded")
        return real_build(config, channels, n_classes)

    monkeypatch.setattr(bench_models, "build_classifier", build)
    names = [tiny_configs["tiny-s4d"], tiny_configs["tiny-attn"]]
    rows = bench_models.run_bench(names, bench_models.Workload(**TINY), reference=names[1], isolate=False)
    failed = rows[0]
    assert failed["model"] == "tiny-s4d" and failed["error"] == "kernel exploded"
    assert failed["train_speed_pct"] is None
    table = format_table(rows, [("model", "model", str), ("params", "params", str)], "model")
    assert "tiny-s4d" in table and "FAILED: kernel exploded" in table
    # A failing reference leaves nothing to compare against: an error, not a table of None.
    with pytest.raises(ConfigError, match="reference model 'tiny-s4d' failed"):
        bench_models.run_bench(names, bench_models.Workload(**TINY), reference=names[0], isolate=False)


def test_peak_memory_sees_a_large_allocation():
    device = torch.device("cpu")
    with measure.PeakMemory(device) as mem:
        block = torch.ones(8 * 1024 * 1024, dtype=torch.float64)  # 64 MB, touched
        del block
    assert mem.method
    assert mem.peak_mb > 32


def test_subprocess_measurement_reports_positive_memory(tiny_configs):
    entry = bench_models.resolve_model(tiny_configs["tiny-s4d"])
    workload = {**TINY, "length": 256, "batch_size": 8}
    row = measure.run_isolated(
        "longrange.bench.models:measure_model", {"name": entry.name, "config": entry.config, "workload": workload}
    )
    assert row["model"] == "tiny-s4d" and row["threads"] == 1
    assert _finite_positive(row["train_peak_mb"]), row
    assert _finite_positive(row["train_s_per_batch"])
    # A user error inside the measurement process comes back as the same clear error.
    with pytest.raises(ConfigError, match="--batch-size must be positive"):
        measure.run_isolated(
            "longrange.bench.models:measure_model",
            {"name": entry.name, "config": entry.config, "workload": {**workload, "batch_size": 0}},
        )


def test_a_measurement_process_flushes_subnormals_as_training_does(monkeypatch):
    """Its figures time what training runs (train/denormals.py); ``LONGRANGE_DENORMALS=keep`` keeps
    IEEE subnormals there too."""
    assert measure.run_isolated("longrange.bench.measure:environment", {})["denormals"] == "flushed"
    monkeypatch.setenv("LONGRANGE_DENORMALS", "keep")
    assert measure.run_isolated("longrange.bench.measure:environment", {})["denormals"] == "kept"


def test_run_isolated_only_runs_benchmark_functions():
    with pytest.raises(ConfigError, match="must be 'longrange.bench"):
        measure.run_isolated("os:system", {"command": "true"})


def test_time_calls_counts_warmup_and_timed_calls():
    calls = []
    times = measure.time_calls(lambda: calls.append(1), warmup=2, batches=3, device=torch.device("cpu"))
    assert len(calls) == 5 and len(times) == 3 and all(t >= 0 for t in times)
    with pytest.raises(ConfigError):
        measure.time_calls(lambda: None, warmup=0, batches=0, device=torch.device("cpu"))


def test_torch_threads_are_restored():
    before = torch.get_num_threads()
    with measure.torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


# Scaling -------------------------------------------------------------------------------------


def test_fit_exponent_recovers_power_laws():
    lengths = [256, 512, 1024, 2048, 4096]
    assert scaling.fit_exponent(lengths, [1e-6 * n for n in lengths]) == pytest.approx(1.0)
    assert scaling.fit_exponent(lengths, [3e-9 * n * n for n in lengths]) == pytest.approx(2.0)
    # Only the upper half counts: a constant overhead at short lengths does not bend the fit.
    times = [0.5, 0.5, 1e-6 * 1024, 1e-6 * 2048, 1e-6 * 4096]
    assert scaling.fit_exponent(lengths, times) == pytest.approx(1.0)
    assert scaling.fit_exponent([256], [1.0]) is None
    assert scaling.growth_label(1.02) == "~linear" and scaling.growth_label(1.95) == "~quadratic"


def test_scaling_runs_and_a_time_budget_stops_it():
    settings = scaling.ScalingSettings(
        d_model=8, d_state=4, n_heads=2, block_size=16, warmup=0, batches=1, device="cpu"
    )
    rows, exponents = scaling.run_scaling(
        ["s4d", "attention-blocked"], [16, 32, 64], settings, time_budget_s=60.0, memory_budget_mb=1e6, isolate=False
    )
    assert [(r["primitive"], r["length"]) for r in rows] == [
        (p, n) for p in ("s4d", "attention-blocked") for n in (16, 32, 64)
    ]
    assert all(r["status"] == "ok" and _finite_positive(r["time_s"]) for r in rows)
    assert set(exponents) == {"s4d", "attention-blocked"} and all(math.isfinite(e) for e in exponents.values())
    # A budget no step can meet: the first length is measured and reported over budget, the rest not run.
    rows, exponents = scaling.run_scaling(["s4d"], [16, 32, 64], settings, time_budget_s=1e-9, isolate=False)
    assert rows[0]["status"] == "over time budget" and "time_s" in rows[0]
    assert all(r["status"].startswith("not run: L=16 took") and "time_s" not in r for r in rows[1:])
    assert exponents["s4d"] is None


def test_scaling_memory_budget_stops_before_an_extrapolated_overflow(monkeypatch):
    """Peak memory quadrupling per doubling (quadratic): the run stops before exceeding the budget."""
    calls = []

    def fake(target, kwargs, isolate=True, timeout=None):
        n = kwargs["length"]
        calls.append(n)
        return {"time_s": 1e-3 * n, "time_std": 0.0, "peak_mb": (n / 100.0) ** 2, "memory_method": "fake"}

    monkeypatch.setattr(scaling.measure, "run_isolated", fake)
    rows, _ = scaling.run_scaling(["attention"], [100, 200, 400, 800, 1600], memory_budget_mb=20.0, time_budget_s=100.0)
    # Measured 1, 4, 16 MB; 800 would need ~64 MB > 20 MB: not run, nor anything after it.
    assert calls == [100, 200, 400]
    assert [r["status"] for r in rows[:3]] == ["ok"] * 3
    assert rows[3]["status"].startswith("not run: L=800 would need about 64 MB")
    assert rows[4]["status"].startswith("not run")
    # A measured peak above the budget stops the primitive too.
    calls.clear()
    rows, _ = scaling.run_scaling(["attention"], [100, 200, 400], memory_budget_mb=2.0, time_budget_s=100.0)
    assert calls == [100, 200] and rows[1]["status"] == "over memory budget"


def test_scaling_rejects_unknown_primitives_and_units():
    with pytest.raises(ConfigError, match="unknown scaling primitive 'mamba'.*attention-blocked"):
        scaling.run_scaling(["mamba"], [16], isolate=False)
    with pytest.raises(ConfigError, match="--unit 'layer'"):
        scaling.ScalingSettings(unit="layer").validate()
    with pytest.raises(ConfigError, match="budgets must be positive"):
        scaling.run_scaling(["s4d"], [16], time_budget_s=0, isolate=False)


def test_block_unit_builds_a_one_block_backbone():
    settings = scaling.ScalingSettings(unit="block", d_model=8, d_state=4, n_heads=2, warmup=0, batches=1, device="cpu")
    point = scaling.measure_point("attention", 16, {**settings.__dict__})
    assert _finite_positive(point["time_s"])
    assert len(scaling.build_unit("s4d", settings).blocks) == 1


# Generation ----------------------------------------------------------------------------------

GEN = dict(
    positions=(4, 12), window=4, naive_positions=(4, 12), naive_repeats=1, n_layers=1, vocab_size=11, device="cpu"
)


def test_generation_rows_and_state_sizes(tiny_configs):
    rows = generation.run_generation(
        [tiny_configs["tiny-s4d"], tiny_configs["tiny-attn"]], generation.GenerationSettings(**GEN), isolate=False
    )
    assert [(r["model"], r["position"]) for r in rows] == [(m, p) for m in ("tiny-s4d", "tiny-attn") for p in (4, 12)]
    for r in rows:
        for key in ("step_ms", "step_tok_per_s", "recompute_ms", "recompute_tok_per_s", "speedup", "state_kb"):
            assert _finite_positive(r[key]), (key, r)
    state = {(r["model"], r["position"]): r["state_kb"] for r in rows}
    assert state["tiny-s4d", 4] == state["tiny-s4d", 12]  # a fixed-size recurrent state
    assert state["tiny-attn", 12] > state["tiny-attn", 4]  # the KV cache grows
    growth = generation.latency_growth(rows, 4, 12)
    assert set(growth) == {"tiny-s4d", "tiny-attn"} and all(_finite_positive(g) for g in growth.values())


def test_generation_windows_and_errors(tmp_path):
    s = generation.GenerationSettings(**GEN)
    assert list(s.window_of(1)) == [0, 1, 2, 3] and list(s.window_of(12)) == [10, 11, 12, 13]
    with pytest.raises(ConfigError, match="'mamba-s6-bi' is bidirectional"):
        generation.run_generation(["mamba-s6-bi"], s, isolate=False)
    with pytest.raises(ConfigError, match="--window must be positive"):
        generation.GenerationSettings(**{**GEN, "window": 0}).validate()
    with pytest.raises(ConfigError, match="unknown model 'nope'"):
        generation.run_generation(["nope"], s, isolate=False)


def test_state_bytes_walks_nested_states():
    from longrange.layers.attention import KVCache

    state = {
        "a": torch.zeros(2, 3),
        "b": [torch.zeros(4, dtype=torch.float64), KVCache(torch.zeros(1), torch.zeros(1), 3)],
        "pos": 5,
    }
    assert generation.state_bytes(state) == 2 * 3 * 4 + 4 * 8 + 4 + 4


# Command line ----------------------------------------------------------------------------------


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="longrange")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", *argv])
    return args.func(args)


def test_cli_table_writes_json_and_png(tiny_configs, tmp_path, capsys):
    out_json, out_png = tmp_path / "rows.json", tmp_path / "bars.png"
    argv = [
        "--models",
        f"{tiny_configs['tiny-s4d']},{tiny_configs['tiny-attn']}",
        "--reference",
        tiny_configs["tiny-attn"],
    ]
    argv += [
        "--batch-size",
        "2",
        "--length",
        "16",
        "--batches",
        "1",
        "--warmup",
        "0",
        "--device",
        "cpu",
        "--no-isolate",
        "--quiet",
    ]
    assert _cli([*argv, "--json", str(out_json), "--plot", str(out_png)]) == 0
    printed = capsys.readouterr().out
    assert "tiny-s4d" in printed and "tiny-attn" in printed and "train speed %" in printed
    payload = json.loads(out_json.read_text())
    assert payload["mode"] == "bench" and [r["model"] for r in payload["rows"]] == ["tiny-s4d", "tiny-attn"]
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_scaling_and_generation_write_their_files(tiny_configs, tmp_path, capsys):
    common = ["--device", "cpu", "--no-isolate", "--quiet"]
    s_json, s_png = tmp_path / "s.json", tmp_path / "s.png"
    argv = ["--scaling", "--primitives", "s4d", "attention", "--lengths", "16,32", "--d-model", "8", "--d-state", "4"]
    argv += ["--batches", "1", "--warmup", "0", "--json", str(s_json), "--plot", str(s_png), *common]
    # n_heads defaults to 4, which divides d_model 8
    assert _cli(argv) == 0
    assert "empirical exponent" in capsys.readouterr().out
    assert set(json.loads(s_json.read_text())["exponents"]) == {"s4d", "attention"}
    assert s_png.stat().st_size > 0
    g_json, g_png = tmp_path / "g.json", tmp_path / "g.png"
    argv = ["--generation", "--models", tiny_configs["tiny-s4d"], "--positions", "2,6", "--window", "2"]
    argv += ["--naive-positions", "6", "--naive-repeats", "1", "--layers", "1", "--vocab-size", "7"]
    argv += ["--json", str(g_json), "--plot", str(g_png), *common]
    assert _cli(argv) == 0
    assert "step latency at position 6 / at position 2" in capsys.readouterr().out
    assert len(json.loads(g_json.read_text())["rows"]) == 2 and g_png.stat().st_size > 0


def test_cli_lists_models_and_is_registered(capsys):
    assert _cli(["--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in bench_models.MODELS)
    from longrange.cli import COMMAND_MODULES, main

    assert "longrange.bench.cli" in COMMAND_MODULES
    assert main(["bench", "--list"]) == 0
    assert main(["bench", "--models", "mamba-s7"]) == 1  # a user error: one line, exit code 1
    assert "unknown model 'mamba-s7'; known models: mamba-s6" in capsys.readouterr().err


def test_cli_bad_list_option_is_a_usage_error():
    with pytest.raises(SystemExit):
        _cli(["--scaling", "--lengths", "16,abc"])
