"""``longrange bench --scan-impl``: the S6 models run the chosen selective-scan implementation,
and each row records the one that ran."""

from __future__ import annotations

import json

import pytest

from longrange.bench import models as bench_models
from longrange.bench import scaling
from longrange.errors import ConfigError
from longrange.ops.scan import dispatch as scan_mod

TINY = dict(batch_size=2, length=16, channels=3, warmup=0, batches=1, device="cpu")


@pytest.fixture
def tiny_s6(tmp_path):
    path = tmp_path / "tiny-s6.json"
    path.write_text(json.dumps({"block": "mamba", "primitive": "s6", "n_layers": 1, "d_model": 8, "d_state": 4}))
    return str(path)


def test_rows_record_the_scan_that_ran(tiny_s6, monkeypatch):
    seen = []
    real = scan_mod.selective_scan_chunked
    monkeypatch.setattr(scan_mod, "selective_scan_chunked", lambda *a, **k: seen.append(1) or real(*a, **k))
    rows = bench_models.run_bench(
        [tiny_s6], bench_models.Workload(**TINY, scan_impl="chunked"), reference=tiny_s6, isolate=False
    )
    assert rows[0]["scan_impl"] == "chunked" and seen
    assert scan_mod._default_impl == "auto"  # restored after the measurement
    rows = bench_models.run_bench([tiny_s6], bench_models.Workload(**TINY), reference=tiny_s6, isolate=False)
    assert rows[0]["scan_impl"] == scan_mod.auto_impl("cpu")


def test_scaling_rows_record_the_scan(monkeypatch):
    settings = scaling.ScalingSettings(d_model=8, d_state=4, warmup=0, batches=1, device="cpu", scan_impl="ref")
    row = scaling.measure_point("s6", 16, vars(settings))
    assert row["scan_impl"] == "ref"


def test_unknown_scan_impl_is_named():
    with pytest.raises(ConfigError, match="--scan-impl 'fast' is unknown"):
        bench_models.Workload(**TINY, scan_impl="fast").validate()
    with pytest.raises(ConfigError, match="--scan-impl"):
        scaling.ScalingSettings(scan_impl="fast").validate()
