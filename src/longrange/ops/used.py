"""Which implementation each op actually ran: every dispatcher reports its choice here.

An op with several implementations (the selective scan: numba, Triton, mamba-ssm, chunked; the
causal convolution; the S4 Cauchy and Vandermonde products; ...) calls :func:`note` with the
implementation it is about to run, after ``impl="auto"`` has been resolved. A run reads the
counts with :func:`calls` (or the short form :func:`kernels`) and records them, so that two runs
that ran different kernels can be told apart from their records, not from a prediction.

    from longrange.ops import used

    used.reset()
    model(x).sum().backward()
    used.kernels()        # {"selective_scan": "numba", "causal_conv1d": "torch"}

The counts are per process and cost one dictionary update per call.
"""
from __future__ import annotations

from collections import Counter, defaultdict

_CALLS: defaultdict[str, Counter] = defaultdict(Counter)


def note(op: str, impl: str) -> None:
    """Record that ``op`` is running its implementation ``impl`` (called by the op's dispatcher)."""
    _CALLS[op][impl] += 1


def reset() -> None:
    """Forget every call recorded so far."""
    _CALLS.clear()


def calls() -> dict[str, dict[str, int]]:
    """``{op: {implementation: calls}}`` since the last :func:`reset`, sorted by op."""
    return {op: dict(sorted(c.items())) for op, c in sorted(_CALLS.items()) if c}


def kernels() -> dict[str, str]:
    """``{op: implementation}`` since the last :func:`reset`; an op that ran several
    implementations lists them joined by ``+`` (e.g. ``"numba+chunked"``)."""
    return {op: "+".join(impls) for op, impls in calls().items()}
