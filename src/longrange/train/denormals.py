"""Subnormal floats on a CPU: flushed to zero while a run trains (``LONGRANGE_DENORMALS``).

A float32 below 1.2e-38 is subnormal, and on many x86 CPUs an arithmetic operation that reads or
writes one takes a slow path in microcode, many times the normal cost. Recurrences make
such values: a gradient carried back through a few hundred decays below one (the selective scan's
backward, the LRU's scan, the delta rule's) shrinks through the subnormal range on its way to zero.
On one Intel Xeon the recall study's Mamba-S6 step (batch 64 x 256) took 525 ms with IEEE
subnormals and 268 ms with them flushed, one scan backward call 315 ms against 55
(docs/small-models.md, "Thirteenth round"); where nothing underflows nothing changes.

:func:`flush_denormals` sets the CPU's flush-to-zero and denormals-are-zero modes
(``torch.set_flush_denormal``) for the calling thread and returns a function that restores the mode
it found: the trainer holds it while it trains and evaluates, and ``longrange``'s command line and
its grid workers set it when they start, so that the threads a run starts later (PyTorch's and
numba's pools) inherit it. Threads started before keep the mode they had. A value that would have
been subnormal is zero instead: results differ from IEEE arithmetic only below 1.2e-38 (2.2e-308 in
float64). The run's record says which mode it trained in
(``device.denormals``). ``LONGRANGE_DENORMALS=keep`` keeps IEEE subnormals.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from longrange.typed import env_choice

__all__ = ["ENV", "flush_denormals", "flushed", "flushing", "mode", "setting"]

#: The environment variable: ``flush`` (the default) or ``keep``.
ENV = "LONGRANGE_DENORMALS"
#: A float32 subnormal: what the probe multiplies (zero when the calling thread flushes).
_SUBNORMAL = 1e-39


def setting() -> str:
    """``"flush"`` (the default) or ``"keep"``, from :data:`ENV`; anything else is an error."""
    return env_choice(ENV, ("flush", "keep"))


def flushing() -> bool:
    """Whether the calling thread flushes subnormal floats to zero now (a product of one, read back)."""
    return (torch.tensor([_SUBNORMAL], dtype=torch.float32) * 1.0).item() == 0.0


def flush_denormals(device: torch.device | str = "cpu") -> Callable[[], None]:
    """Flush subnormals to zero on the calling thread where ``device`` is a CPU and :func:`setting`
    is ``"flush"``; returns a function that restores the mode found (nothing to restore elsewhere,
    with ``keep``, or on a CPU without the modes)."""
    if torch.device(device).type != "cpu" or setting() == "keep":
        return lambda: None
    before = flushing()
    if not torch.set_flush_denormal(True):  # a CPU without the modes
        return lambda: None
    return lambda: torch.set_flush_denormal(before)


@contextmanager
def flushed(device: torch.device | str = "cpu") -> Iterator[None]:
    """:func:`flush_denormals` for the block, the mode found restored after it (scripts that time
    kernels as training runs them)."""
    restore = flush_denormals(device)
    try:
        yield
    finally:
        restore()


def mode(device: torch.device | str) -> str:
    """What a run on ``device`` records: ``"flushed"`` where :func:`flush_denormals` flushes there
    (a CPU with the modes, the setting ``flush``), ``"kept"`` otherwise."""
    with flushed(device):
        return "flushed" if torch.device(device).type == "cpu" and flushing() else "kept"
