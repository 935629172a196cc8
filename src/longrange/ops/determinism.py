"""Implementations whose backward is not deterministic, under PyTorch's deterministic algorithms.

A dispatcher keeps a table ``DETERMINISTIC_BACKWARD`` (implementation -> whether its backward gives
the same bits for the same inputs). With ``torch.use_deterministic_algorithms(True)`` its ``"auto"``
picks only deterministic implementations, and asking for another by name calls
:func:`refuse_nondeterministic`: a RuntimeError naming the deterministic ones, or a warning in
PyTorch's ``warn_only`` mode, as PyTorch does for its own operations.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch


def refuse_nondeterministic(op: str, impl: str, why: str, alternatives: Sequence[str], stacklevel: int = 3) -> None:
    """Refuse ``op``'s implementation ``impl``, whose backward is not deterministic (``why``), while
    deterministic algorithms are on; nothing when they are off."""
    if not torch.are_deterministic_algorithms_enabled():
        return
    message = (
        f"{op}: impl={impl!r} has a non-deterministic backward ({why}), and deterministic algorithms are on "
        f"(torch.use_deterministic_algorithms); use one of the deterministic implementations "
        f"{', '.join(repr(a) for a in alternatives)} (impl='auto' picks one)"
    )
    if torch.is_deterministic_algorithms_warn_only_enabled():
        warnings.warn(message, stacklevel=stacklevel + 1)
    else:
        raise RuntimeError(message)
