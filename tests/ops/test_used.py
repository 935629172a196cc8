"""The record of which implementation each op ran."""
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
