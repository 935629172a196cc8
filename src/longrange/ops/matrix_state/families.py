"""The module that implements each matrix-state op (the two delta rules share one): the one map
that the dispatch (:mod:`.dispatch`) and the probe of the maintained kernels (:mod:`.external`)
both read. Imported with them, so that a compiled model's graph does not break at an import."""

from __future__ import annotations

from types import ModuleType

from longrange.ops.matrix_state import delta_rule, gla, mamba3, mamba3_mimo, ssd

FAMILIES: dict[str, ModuleType] = {
    "delta_rule": delta_rule,
    "gla": gla,
    "mamba3": mamba3,
    "mamba3_mimo": mamba3_mimo,
    "ssd": ssd,
}


def family(op: str) -> ModuleType:
    """The module of ``op`` (``ssd``, ``gla``, ``delta_rule``, ``gated_delta_rule``, ``mamba3``,
    ``mamba3_mimo``)."""
    return FAMILIES["delta_rule" if op == "gated_delta_rule" else op]
