"""The record of which implementation each op ran."""

import interpreter

from longrange.ops import used


def test_note_counts_and_reset():
    used.reset()
    assert used.calls() == {} and used.kernels() == {}
    used.note("selective_scan", "numba")
    used.note("selective_scan", "numba")
    used.note("causal_conv1d", "torch")
    assert used.calls() == {"causal_conv1d": {"torch": 1}, "selective_scan": {"numba": 2}}
    assert used.kernels() == {"causal_conv1d": "torch", "selective_scan": "numba"}
    used.note("selective_scan", "chunked")
    assert used.kernels()["selective_scan"] == "chunked+numba"
    used.reset()
    assert used.calls() == {}


# --------------------------------------------------------------------------------------------
# The dispatchers report the implementation they ran
# --------------------------------------------------------------------------------------------

import pytest  # noqa: E402
import torch  # noqa: E402

from longrange.ops import conv, scan  # noqa: E402
from longrange.ops.scan import numba as scan_numba  # noqa: E402


def _scan_args(b=1, d=4, n=3, l=5):
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(b, d, l, generator=g),
        torch.rand(b, d, l, generator=g),
        -torch.rand(d, n, generator=g) - 0.1,
        torch.randn(b, n, l, generator=g),
        torch.randn(b, n, l, generator=g),
    )


def _ran(fn, *args, **kwargs) -> dict:
    used.reset()
    fn(*args, **kwargs)
    return used.calls()


def test_scan_auto_records_what_auto_picks():
    args = _scan_args()
    expected = "numba" if scan_numba.numba_available() else "chunked"
    assert scan.auto_impl("cpu") == expected
    assert _ran(scan.selective_scan, *args) == {"selective_scan": {expected: 1}}
    with scan.default_impl("ref"):
        assert _ran(scan.selective_scan, *args) == {"selective_scan": {"ref": 1}}


@pytest.mark.parametrize("impl", ["chunked", "ref", "numba"])
def test_scan_forced_records_the_forced_impl(impl):
    if impl == "numba" and not scan_numba.numba_available():
        pytest.skip("numba does not import")
    assert _ran(scan.selective_scan, *_scan_args(), impl=impl) == {"selective_scan": {impl: 1}}


def test_scan_triton_in_the_interpreter_records_triton(monkeypatch):
    pytest.importorskip("triton")
    interpreter.use(monkeypatch)
    assert _ran(scan.selective_scan, *_scan_args(), impl="triton") == {"selective_scan": {"triton": 1}}


def test_scan_that_cannot_run_records_nothing():
    used.reset()
    with pytest.raises(RuntimeError, match="impl='cuda'"):
        scan.selective_scan(*_scan_args(), impl="cuda")
    assert used.calls() == {}


def test_causal_conv1d_records_auto_and_forced():
    x, w, bias = torch.randn(2, 3, 7), torch.randn(3, 4), torch.randn(3)
    auto = "numba" if scan_numba.numba_available() else "torch"
    assert conv.auto_impl("cpu") == auto
    assert _ran(conv.causal_conv1d, x, w, bias) == {"causal_conv1d": {auto: 1}}
    assert _ran(conv.causal_conv1d, x, w, bias, impl="ref") == {"causal_conv1d": {"ref": 1}}
    assert _ran(conv.causal_conv1d, x, w, bias, impl="torch") == {"causal_conv1d": {"torch": 1}}
    assert conv.available_impls("cpu") == (("ref", "torch", "numba") if auto == "numba" else ("ref", "torch"))


def test_a_mamba_block_records_each_of_its_ops():
    from longrange.blocks.mamba import MambaBlock
    from longrange.layers.s6 import S6
    from longrange.ops import norm

    block = MambaBlock(4, make_ssm=lambda width: S6(width, d_state=3))
    used.reset()
    block(torch.randn(2, 5, 4)).sum().backward()
    assert used.kernels() == {
        "selective_scan": scan.auto_impl("cpu"),
        "causal_conv1d": conv.auto_impl("cpu"),
        "rms_norm": norm.auto_impl("cpu", width=4),  # the block's norm
    }
