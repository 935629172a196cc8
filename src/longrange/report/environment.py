"""Where a cell's runs trained and which kernels they ran: one text per run (:func:`device_text`,
:func:`kernels_text`, "unknown" for summaries that do not record it), the seeds under each value,
and :func:`mixing_warnings`, the cells whose runs differ in either (their seeds may then differ by
more than chance)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from longrange.report.aggregate import ResultCell
from longrange.report.collect import Run

#: What a run that does not record its device or kernels shows.
UNKNOWN = "unknown"


def device_text(run: Run) -> str:
    """Where a run trained, e.g. ``cuda: NVIDIA A100-SXM4-80GB ×4`` or ``cpu: AMD EPYC``; a CPU run
    that kept IEEE subnormal floats (``LONGRANGE_DENORMALS=keep``, train/denormals.py) says so, so that
    a cell mixing it with flushed runs is named. A CPU run recorded before runs recorded the mode
    kept them (nothing flushed them then), and a run resumed in the other mode kept them in part."""
    d = run.device
    if not d:
        return UNKNOWN
    kind, name, count = str(d.get("type", "?")), d.get("name"), d.get("count")
    text = f"{kind}: {name}" if name and name != kind else kind
    text += f" ×{count}" if isinstance(count, int) and count > 1 else ""
    if kind != "cpu":
        return text
    return text + SUBNORMALS_TEXT.get(str(d.get("denormals", "kept")), f", subnormals {d.get('denormals')}")


#: What a CPU run's device text adds for each recorded subnormal mode (train/denormals.py).
SUBNORMALS_TEXT = {"flushed": "", "kept": ", subnormals kept", "mixed": ", subnormals kept in part"}


def kernels_text(run: Run) -> str:
    """The implementation each op ran, e.g. ``causal_conv1d=torch, selective_scan=numba``; "-" when
    no op with several implementations ran."""
    if run.kernels is None:
        return UNKNOWN
    return ", ".join(f"{op}={impl}" for op, impl in sorted(run.kernels.items())) or "-"


def seeds_by_value(cell: ResultCell, text: Callable[[Run], str]) -> dict[str, list[int]]:
    """The seeds of the cell's runs under each value of ``text``, in seed order."""
    out: dict[str, list[int]] = {}
    for r in cell.runs:
        out.setdefault(text(r), []).append(r.seed)
    return out


def values_text(values: dict[str, list[int]]) -> str:
    """The one value, or each value with its seeds (``a (seeds 0, 1); b (seed 2)``)."""
    if len(values) == 1:
        return next(iter(values))
    return "; ".join(
        f"{v} (seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))})" for v, seeds in values.items()
    )


def mixing_warnings(cells: Sequence[ResultCell]) -> list[str]:
    """One line per cell whose runs trained on different devices or ran different kernels (runs
    that do not record them are not counted): their seeds may differ by more than chance."""
    out = []
    for c in cells:
        for what, text in (("devices", device_text), ("kernels", kernels_text)):
            values = {v: seeds for v, seeds in seeds_by_value(c, text).items() if v != UNKNOWN}
            if len(values) > 1:
                stage = "final stage" if c.kind == "final" else "pretraining"
                out.append(f"{c.row} on {c.task} ({stage}) mixes {what}: {values_text(values)}")
    return out
