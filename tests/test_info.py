"""``longrange info``: the table and the command."""

from __future__ import annotations

import json

import torch

from longrange.cli import COMMAND_MODULES, main
from longrange.info import dispatch, format_info, info_table
from longrange.ops import complex_scan, conv, scan, ssm_kernels
from longrange.ops.conv import numba as conv_numba
from longrange.ops.dispatch import DISPATCHERS


def test_info_table_names_versions_devices_and_dispatch():
    table = info_table()
    assert table["versions"]["torch"] == torch.__version__
    for name in ("longrange", "numba", "triton", "CUDA (torch build)"):
        assert name in table["versions"]
    assert set(table["optional"]) >= {
        "mamba_ssm",
        "causal_conv1d",
        "pykeops",
        "scan_triton",
        "scan_numba",
        "conv_numba",
        "ssm_kernels_numba",
        "ssm_kernels_triton",
    }
    for st in table["optional"].values():
        assert isinstance(st["usable"], bool) and (st["usable"] or st["reason"])
    names = [d["device"] for d in table["devices"]]
    assert names[0] == "cpu" and (len(names) > 1) == torch.cuda.is_available()
    assert set(table["dispatch"]) == set(names)
    for ops in table["dispatch"].values():
        assert set(ops) == {*DISPATCHERS, "fft_conv"}  # every registered op: at least these
        assert set(ops) >= {"selective_scan", "causal_conv1d", "vandermonde", "cauchy", "complex_diag_scan", "fft_conv"}
    cpu = table["dispatch"]["cpu"]
    assert cpu["selective_scan"] == scan.auto_impl("cpu")
    assert (
        cpu["causal_conv1d"].split(" ")[0]
        == conv.auto_impl("cpu")
        == ("numba" if conv_numba.numba_available() else "torch")
    )
    assert cpu["cauchy"] == ssm_kernels.auto_impl("cauchy", "cpu") == ssm_kernels.cauchy_impl("cpu")
    assert cpu["vandermonde"] == ssm_kernels.auto_impl("vandermonde", "cpu")
    assert cpu["complex_diag_scan"] == "loop (steps within chunks)" and complex_scan.auto_impl("cpu") == "loop"
    assert table["implementations"]["cpu"]["complex_diag_scan"]["available"] == ["chunk", "loop", "ref"]
    for device in names:  # every implementation that can run, auto's choice among them
        for op in ssm_kernels.OPS:
            st = table["implementations"][device][op]
            assert st["available"] == ssm_kernels.available_impls(op, device) and st["auto"] in st["available"]
            assert {"chunked", "ref"} <= set(st["deterministic_backward"]) <= set(st["available"])
    text = format_info(table)
    assert "selective_scan" in text and "mamba_ssm" in text and 'impl="auto"' in text
    assert "implementations that can run here" in text and "vandermonde" in text
    auto_table = text.split('implementation run by impl="auto"')[1].split("implementations that can run here")[0]
    assert "\ncomplex_diag_scan " in auto_table and "loop (steps within chunks)" in auto_table


def test_dispatch_on_cuda_follows_the_ops_own_choice():
    ops = dispatch("cuda")  # asks the ops; needs no GPU
    assert ops["selective_scan"].split(" ")[0] == scan.auto_impl("cuda")
    assert ops["causal_conv1d"].split(" ")[0] == conv.auto_impl("cuda")
    assert ops["cauchy"] == ssm_kernels.auto_impl("cauchy", "cuda")
    assert (
        ops["complex_diag_scan"] == "chunk (matrix products within chunks)"
        and complex_scan.auto_impl("cuda") == "chunk"
    )


def test_info_command(capsys):
    assert "longrange.info" in COMMAND_MODULES
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "versions" in out and "selective_scan" in out
    assert main(["info", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert table["dispatch"]["cpu"]["fft_conv"] == "direct up to 24 positions, else fft"
