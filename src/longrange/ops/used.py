"""Which implementation each op actually ran: every dispatcher reports its choice here.

An op with several implementations (the selective scan: numba, Triton, mamba-ssm, chunked; the
causal convolution; the S4 Cauchy and Vandermonde products; ...) calls :func:`note` with the
implementation it is about to run, after ``impl="auto"`` has been resolved. A run reads the
counts with :func:`calls` (or the short form :func:`kernels`) and records them, so that two runs
that ran different kernels can be told apart from their records, not from a prediction.

    from longrange.ops import used

    used.reset()
    model(x).sum().backward()
    used.kernels()        # {"selective_scan": "numba", "causal_conv1d": "numba"}

The counts are per process and cost one dictionary update per call.

Under ``torch.compile`` the choice of implementation is made once, while the model is traced, but
every call of the compiled model still counts: a traced :func:`note` becomes a call of the operator
``torch.ops.longrange.note_used`` in the graph, whose Python body updates the counts each time the
graph runs. Tracing never reads the counts, so they cause no guard and no recompilation (a plain
dictionary update would be replayed by Dynamo with a guard on the counts, recompiling at every
call), and ``fullgraph=True`` holds.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import torch
from torch import Tensor

from longrange.ops.custom_ops import qualname

_CALLS: defaultdict[str, Counter] = defaultdict(Counter)

#: The tensor the operator declares it mutates, so that compiled graphs keep the call (an operator
#: without outputs or effects would be removed); never read or written.
_TOKEN = torch.zeros(())


@torch.library.custom_op(qualname("note_used"), mutates_args=("token",))
def _note_op(token: Tensor, op: str, impl: str) -> None:
    """:func:`note` inside a compiled graph (see the module docstring)."""
    _CALLS[op][impl] += 1


@_note_op.register_fake
def _(token: Tensor, op: str, impl: str) -> None:
    return None


def note(op: str, impl: str) -> None:
    """Record that ``op`` is running its implementation ``impl`` (called by the op's dispatcher)."""
    if torch.compiler.is_compiling():
        _note_op(_TOKEN, op, impl)
    else:
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
