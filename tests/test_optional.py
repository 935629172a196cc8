"""Optional kernels are reported only when their compiled part imports; otherwise the next-best
implementation runs. Fake packages (modules in sys.modules, files on sys.path) stand in for
mamba-ssm, causal-conv1d and pykeops."""

from __future__ import annotations

import importlib
import sys
import types

import pytest
import torch

from longrange import _optional
from longrange.ops import conv as conv_mod
from longrange.ops.conv import numba as conv_numba
from longrange.ops.scan import dispatch as scan_mod

FAKE_NAMES = (
    "mamba_ssm",
    "mamba_ssm.ops",
    "mamba_ssm.ops.selective_scan_interface",
    "selective_scan_cuda",
    "causal_conv1d",
    "causal_conv1d_cuda",
    "pykeops",
    "pykeops.torch",
)


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


def _wrapper_only_call(*args, **kwargs):
    raise RuntimeError("the compiled extension is missing")  # what the wrapper does on its first call


@pytest.fixture
def fake_packages(tmp_path):
    """Install fakes with ``install({name: module or None})`` (None: the import fails), then
    reload :mod:`longrange._optional`; everything is restored afterwards."""
    saved = {name: sys.modules[name] for name in FAKE_NAMES if name in sys.modules}
    saved_path = list(sys.path)

    def install(fakes: dict[str, types.ModuleType | None], path_files: dict[str, str] | None = None):
        for name in FAKE_NAMES:
            sys.modules.pop(name, None)
        for name, mod in fakes.items():
            sys.modules[name] = mod
        for filename, text in (path_files or {}).items():
            (tmp_path / filename).write_text(text)
        if path_files:
            sys.path.insert(0, str(tmp_path))
        importlib.invalidate_caches()
        importlib.reload(_optional)
        return _optional

    yield install
    for name in FAKE_NAMES:
        sys.modules.pop(name, None)
    sys.modules.update(saved)
    sys.path[:] = saved_path
    importlib.invalidate_caches()
    importlib.reload(_optional)


def _mamba_wrapper():
    return {
        "mamba_ssm": _module("mamba_ssm"),
        "mamba_ssm.ops": _module("mamba_ssm.ops"),
        "mamba_ssm.ops.selective_scan_interface": _module(
            "mamba_ssm.ops.selective_scan_interface", selective_scan_fn=_wrapper_only_call
        ),
    }


def _next_best_on_cuda() -> str:
    return "triton" if scan_mod._triton_scan()[0] is not None else "chunked"


def test_mamba_wrapper_without_extension_is_not_used(fake_packages):
    opt = fake_packages({**_mamba_wrapper(), "selective_scan_cuda": None})
    assert opt.selective_scan_cuda_fn is None and not opt.available()["mamba_ssm"]
    st = opt.status()["mamba_ssm"]
    assert st["installed"] and not st["extension_imports"] and not st["usable"]
    assert "selective_scan_cuda does not import" in st["reason"]
    assert scan_mod.auto_impl("cuda") == _next_best_on_cuda()
    assert scan_mod.auto_impl("cpu") in ("numba", "chunked")
    u = torch.randn(1, 2, 3)
    with pytest.raises(
        RuntimeError, match="impl='cuda' needs mamba_ssm with its compiled extension selective_scan_cuda"
    ):
        scan_mod.selective_scan(u, u, -torch.ones(2, 1), torch.randn(1, 1, 3), torch.randn(1, 1, 3), impl="cuda")


def test_mamba_with_extension_is_used_where_it_can_run(fake_packages):
    opt = fake_packages({**_mamba_wrapper(), "selective_scan_cuda": _module("selective_scan_cuda")})
    assert opt.selective_scan_cuda_fn is _wrapper_only_call and opt.available()["mamba_ssm"]
    assert opt.status()["mamba_ssm"]["usable"]
    assert scan_mod.auto_impl("cuda") == "cuda"
    assert scan_mod.auto_impl("cuda", has_initial_state=True) == _next_best_on_cuda()
    assert scan_mod.auto_impl("cuda", dtype=torch.float64) == _next_best_on_cuda()
    assert scan_mod.auto_impl("cpu") != "cuda"


def test_broken_extension_on_path_reports_its_error(fake_packages):
    """A compiled extension that fails to load (e.g. built against another torch) is reported with its error."""
    opt = fake_packages(
        _mamba_wrapper(),
        {"selective_scan_cuda.py": "raise ImportError('undefined symbol: _ZN3c10fake')\n"},
    )
    assert opt.selective_scan_cuda_fn is None
    assert "undefined symbol" in opt.status()["mamba_ssm"]["reason"]


def test_causal_conv1d_wrapper_without_extension_falls_back(fake_packages):
    wrapper = _module("causal_conv1d", causal_conv1d_fn=_wrapper_only_call)
    opt = fake_packages({"causal_conv1d": wrapper, "causal_conv1d_cuda": None})
    assert opt.causal_conv1d_cuda_fn is None and "causal_conv1d_cuda" in opt.status()["causal_conv1d"]["reason"]
    assert conv_mod.auto_impl("cuda") == "torch"
    x, w = torch.randn(1, 2, 5), torch.randn(2, 4)
    with pytest.raises(RuntimeError, match="compiled extension causal_conv1d_cuda"):
        conv_mod.causal_conv1d(x, w, impl="cuda")
    torch.testing.assert_close(conv_mod.causal_conv1d(x, w), conv_mod.causal_conv1d_ref(x, w))

    opt = fake_packages({"causal_conv1d": wrapper, "causal_conv1d_cuda": _module("causal_conv1d_cuda")})
    assert opt.causal_conv1d_cuda_fn is _wrapper_only_call
    assert conv_mod.auto_impl("cuda", width=4) == "cuda"
    assert conv_mod.auto_impl("cuda", width=5) == "torch"  # the kernel supports widths 2-4
    assert conv_mod.auto_impl("cuda", dtype=torch.float64) == "torch"
    assert conv_mod.auto_impl("cpu") == ("numba" if conv_numba.numba_available() else "torch")  # never the CUDA kernel


@pytest.mark.parametrize("gpu", [False, True])
def test_pykeops_needs_its_cuda_toolchain(fake_packages, gpu):
    keops = _module("pykeops", config=_module("pykeops.config", gpu_available=gpu))
    opt = fake_packages({"pykeops": keops, "pykeops.torch": _module("pykeops.torch", LazyTensor=object)})
    assert (opt.pykeops is not None) == gpu
    assert opt.status()["pykeops"]["usable"] == gpu


def test_missing_packages_are_reported_as_not_installed(fake_packages):
    opt = fake_packages({name: None for name in FAKE_NAMES})
    assert opt.available() == {"mamba_ssm": False, "causal_conv1d": False, "pykeops": False}
    for info in opt.status().values():
        assert not info["usable"] and info["reason"]


def test_info_reports_a_wrapper_without_extension(fake_packages):
    from longrange.info import dispatch, format_info, info_table

    fake_packages({**_mamba_wrapper(), "selective_scan_cuda": None})
    table = info_table()
    assert not table["optional"]["mamba_ssm"]["usable"]
    assert "selective_scan_cuda does not import" in format_info(table)
    assert dispatch("cuda")["selective_scan"] == _next_best_on_cuda()
