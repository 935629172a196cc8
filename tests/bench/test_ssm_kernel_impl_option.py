"""``longrange bench --ssm-kernel-impl``: S4, S4D and DLR run the chosen implementation of the
Vandermonde and Cauchy products, and each row records the one that ran."""

from __future__ import annotations

import json

import pytest

from longrange.bench import measure, scaling
from longrange.bench import models as bench_models
from longrange.cli import main
from longrange.errors import ConfigError
from longrange.ops import ssm_kernels, used

TINY = dict(batch_size=2, length=16, channels=3, warmup=0, batches=1, device="cpu")


@pytest.fixture
def tiny_s4(tmp_path):
    path = tmp_path / "tiny-s4.json"
    path.write_text(
        json.dumps(
            {
                "block": "simple",
                "primitive": "s4",
                "n_layers": 1,
                "d_model": 8,
                "d_state": 4,
                "primitive_options": {"l_max": 16},
            }
        )
    )
    return str(path)


def test_model_rows_record_the_products_that_ran(tiny_s4):
    used.reset()
    rows = bench_models.run_bench(
        [tiny_s4], bench_models.Workload(**TINY, ssm_kernel_impl="chunked"), reference=tiny_s4, isolate=False
    )
    assert rows[0]["ssm_kernel_impl"] == "chunked" and used.calls()["cauchy"].keys() == {"chunked"}
    assert ssm_kernels.dispatch._defaults == {"vandermonde": "auto", "cauchy": "auto"}  # restored afterwards
    rows = bench_models.run_bench([tiny_s4], bench_models.Workload(**TINY), reference=tiny_s4, isolate=False)
    assert rows[0]["ssm_kernel_impl"] == ssm_kernels.auto_impl("cauchy", "cpu")


@pytest.mark.parametrize("primitive, op", [("s4d", "vandermonde"), ("dlr", "vandermonde"), ("s4", "cauchy")])
def test_scaling_rows_record_the_products(primitive, op):
    settings = scaling.ScalingSettings(d_model=8, d_state=4, warmup=0, batches=1, device="cpu", ssm_kernel_impl="ref")
    used.reset()
    row = scaling.measure_point(primitive, 16, vars(settings))
    assert row["ssm_kernel_impl"] == "ref" and used.kernels()[op] == "ref"


def test_pykeops_applies_to_the_cauchy_sum_only():
    with measure.ssm_kernel_impl("pykeops", "cpu") as label:
        assert ssm_kernels.dispatch._defaults == {"vandermonde": "auto", "cauchy": "pykeops"}
    assert label == f"vandermonde auto ({ssm_kernels.auto_impl('vandermonde', 'cpu')}), cauchy pykeops"


def test_unknown_ssm_kernel_impl_is_named(capsys):
    with pytest.raises(ConfigError, match="--ssm-kernel-impl 'fast' is unknown"):
        bench_models.Workload(**TINY, ssm_kernel_impl="fast").validate()
    with pytest.raises(ConfigError, match="--ssm-kernel-impl"):
        scaling.ScalingSettings(ssm_kernel_impl="fast").validate()
    assert (
        main(["bench", "--scaling", "--primitives", "s4d", "--lengths", "16", "--ssm-kernel-impl", "fast", "--quiet"])
        != 0
    )
