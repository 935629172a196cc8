"""How much memory a model's evaluation needs at a given length, and the budget it must stay under.

    need = measure_forward_memory(model, head, lengths=(64, 128, 256))   # bytes per sequence
    budget = memory_budget(device)                    # --memory-budget, $LONGRANGE_MEMORY_BUDGET, or 80% free
    batch = need.batch_size(length=4096, budget=budget, most=64)   # a MemoryBudgetError if one sequence does not fit

The need is *measured*, not modelled: one forward pass at batch 1 for each of a few lengths
(:data:`PROBE_LENGTHS`, or the length asked for when it is shorter) runs under :class:`TensorMemory`, a dispatch mode that adds up the bytes of every tensor storage an
operation creates and subtracts them when the storage is freed, and keeps the peak. A quadratic
``a + b·L + c·L²`` through three such peaks extrapolates to any length (exact for the models here:
state-space layers allocate a fixed number of (L, width) activations, their ops work in pieces of
bounded size (``ops/chunking.py``); attention adds an (L, L) term where its kernel materialises the
scores, none where PyTorch's fused kernels run). What PyTorch's fused kernels allocate inside
themselves is not seen, nor memory the allocator keeps: the budget reserves :data:`MARGIN` times
the counted need (``benchmarks/eval_memory.py`` compares the two with the peak resident memory).
"""

from __future__ import annotations

import os
import re
import weakref
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

from longrange.errors import ConfigError
from longrange.models.record import HeadRecord

#: Environment variable with the default memory budget of evaluation (e.g. "8GiB").
BUDGET_ENV = "LONGRANGE_MEMORY_BUDGET"
#: Share of the free memory that evaluation may use when no budget is given.
FREE_SHARE = 0.8
#: Lengths of the probe's forward passes. Short lengths mislead: below about 1000 positions fixed
#: costs and the switches between kernels' paths bend the curve (S4D's need per position falls from
#: 5.9 KB at 64 positions to 3.4 KB at 1024 and stays there).
PROBE_LENGTHS = (1024, 2048, 4096)
#: A quadratic term is kept only when it makes at least this share of the need at the longest probe.
QUADRATIC_SHARE = 0.02
#: The counted need is multiplied by this for the budget: what fused kernels allocate inside
#: themselves and what the allocator holds beyond the live tensors are not counted. On CPU the peak
#: resident memory grew by 1.0-1.3x the counted peak for the state-space models and 1.4-1.75x for
#: attention (``benchmarks/eval_memory.py``); the margin covers the usual case, not every one.
MARGIN = 1.5

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


class MemoryBudgetError(ConfigError):
    """An evaluation would need more memory than its budget allows."""


def parse_bytes(text: str | int | float, where: str = "--memory-budget") -> int:
    """``"8GiB"``, ``"512MB"``, ``"2.5e9"`` or a number of bytes -> bytes (a ConfigError naming ``where``)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
        if not match or match.group(2).lower() not in _UNITS:
            raise ConfigError(f"{where}: expected a size such as 8GiB, 512MB or a number of bytes, got {text!r}")
        value, unit = float(match.group(1)), match.group(2).lower()
    size = int(value * _UNITS[unit])
    if size <= 0:
        raise ConfigError(f"{where}: the budget must be positive, got {text!r}")
    return size


def format_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # pragma: no cover


def free_memory(device: torch.device) -> int | None:
    """Bytes free on ``device``: the GPU's free memory, or the machine's available memory (Linux), or None."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@dataclass(frozen=True)
class Budget:
    """How many bytes evaluation may allocate, and where the figure came from (for messages)."""

    bytes: int
    source: str


def memory_budget(device: torch.device, budget: str | int | None = None) -> Budget:
    """The budget given, else ``$LONGRANGE_MEMORY_BUDGET``, else :data:`FREE_SHARE` of the free memory."""
    if budget is not None:
        return Budget(parse_bytes(budget), "--memory-budget")
    env = os.environ.get(BUDGET_ENV)
    if env:
        return Budget(parse_bytes(env, f"${BUDGET_ENV}"), f"${BUDGET_ENV}")
    free = free_memory(device)
    if free is None:
        return Budget(8 * 2**30, "the default of 8 GiB (the free memory is unknown here)")
    return Budget(int(FREE_SHARE * free), f"{FREE_SHARE:.0%} of the {format_bytes(free)} free on {device.type}")


class TensorMemory(TorchDispatchMode):
    """Counts the bytes of the tensor storages that operations create while it is active, and their peak.

    A storage is counted once (views share it) and released when it is freed. Tensors that
    existed before (parameters, inputs) are not counted.
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Not used under torch.compile: leaving this True would import torch._dynamo (seconds) on first use.
        return False

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.now = 0
        self.peak = 0

    def _track(self, t: Tensor) -> None:
        storage = t.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or key in self.live:
            return
        self.live[key] = size
        self.now += size
        self.peak = max(self.peak, self.now)
        weakref.finalize(storage, self._release, key, size)

    def _release(self, key: int, size: int) -> None:
        if self.live.pop(key, None) is not None:
            self.now -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tree_map_only(Tensor, self._track, out)
        return out


def probe_batch(head: HeadRecord | Mapping[str, Any], length: int, device: torch.device) -> dict[str, Tensor]:
    """A batch of one synthetic sequence of ``length`` positions of the kind the model reads
    (token ids, or numeric channels), two sequences for a retrieval head. ``head``: a run's
    :class:`~longrange.models.record.HeadRecord`, or a mapping with the fields the probe reads
    (``kind``, ``input_kind``, ``vocab_size``, ``d_input``, ``mask_channel``)."""
    from longrange.data.tokenize import FIRST_TOKEN_ID

    if isinstance(head, HeadRecord):
        head = head.to_json()
    if head.get("input_kind") == "tokens":
        vocab = int(head.get("vocab_size") or FIRST_TOKEN_ID + 1)
        low = FIRST_TOKEN_ID if vocab > FIRST_TOKEN_ID else 0
        gen = torch.Generator().manual_seed(0)
        inputs = torch.randint(low, vocab, (1, length), generator=gen).to(device)
    else:
        channels = int(head.get("d_input", 1)) + int(bool(head.get("mask_channel", False)))
        inputs = torch.zeros(1, length, channels, device=device)
    batch = {"inputs": inputs, "lengths": torch.full((1,), length, dtype=torch.long, device=device)}
    if head.get("kind") == "retrieval":
        batch["inputs2"], batch["lengths2"] = inputs, batch["lengths"]
    return batch


@torch.no_grad()
def forward_peak(model: nn.Module, head: HeadRecord | Mapping[str, Any], length: int, autocast: Any = None) -> int:
    """Peak bytes that one forward pass of ``model`` on one sequence of ``length`` allocates, plus
    twice its output (the objective's loss over it)."""
    device = next(model.parameters()).device
    batch = probe_batch(head, length, device)
    meter = TensorMemory()
    with autocast or nullcontext():
        with meter:
            out = model(batch["inputs"], batch["lengths"], batch.get("inputs2"), batch.get("lengths2"))
    return meter.peak + 2 * out.numel() * 4


@dataclass(frozen=True)
class MemoryNeed:
    """Bytes one sequence of length L needs in evaluation: ``a + b·L + c·L²`` (fitted to counted
    peaks), and :data:`MARGIN` times that for the budget."""

    a: float
    b: float
    c: float
    measured: tuple[tuple[int, int], ...]  # (length, peak bytes) of the probes

    def counted(self, length: int) -> int:
        """The bytes of tensors one sequence of ``length`` allocates, as the probes count them."""
        return int(max(self.a + self.b * length + self.c * length * length, 1.0))

    def per_sequence(self, length: int) -> int:
        """What the budget reserves for one sequence: :meth:`counted` times :data:`MARGIN`."""
        return int(MARGIN * self.counted(length))

    def describe(self, length: int) -> str:
        quadratic = MARGIN * self.c * length * length
        text = f"{format_bytes(self.per_sequence(length))} per sequence of length {length}"
        if quadratic > 0.25 * self.per_sequence(length):
            text += f" (of which {format_bytes(quadratic)} grow with the square of the length: dense attention scores)"
        return text

    def batch_size(self, length: int, budget: Budget, most: int, what: str = "the evaluation") -> int:
        """The largest batch up to ``most`` whose need at ``length`` stays within ``budget``; a
        :class:`MemoryBudgetError` when one sequence does not fit."""
        one = self.per_sequence(length)
        if one > budget.bytes:
            raise MemoryBudgetError(
                f"{what} needs about {self.describe(length)}, more than the memory budget of "
                f"{format_bytes(budget.bytes)} ({budget.source}); evaluate at a shorter length, or raise the budget "
                f"with --memory-budget SIZE (or ${BUDGET_ENV}) if the machine has the memory"
            )
        return max(1, min(most, budget.bytes // one))


def fit_need(points: Sequence[tuple[int, int]]) -> MemoryNeed:
    """``a + b·L + c·L²`` through the three longest (length, bytes) points when its quadratic term
    makes at least :data:`QUADRATIC_SHARE` of the longest one, else the line through the two
    longest (a constant per position for one point); coefficients are never negative."""
    pts = sorted(set(points))
    if len(pts) == 1:
        ((l0, m0),) = pts
        return MemoryNeed(0.0, m0 / l0, 0.0, tuple(pts))
    if len(pts) >= 3:
        (l1, m1), (l2, m2), (l3, m3) = pts[-3:]
        # divided differences: c is the second one
        c = ((m3 - m2) / (l3 - l2) - (m2 - m1) / (l2 - l1)) / (l3 - l1)
        if c > 0 and c * l3 * l3 >= QUADRATIC_SHARE * m3:
            b = (m3 - m2) / (l3 - l2) - c * (l3 + l2)
            return MemoryNeed(max(m3 - b * l3 - c * l3 * l3, 0.0), max(b, 0.0), c, tuple(pts))
    (l0, m0), (l1, m1) = pts[-2:]
    b = max((m1 - m0) / (l1 - l0), 0.0)
    return MemoryNeed(max(m1 - b * l1, 0.0), b, 0.0, tuple(pts))


def measure_need(
    model: nn.Module, head: HeadRecord | Mapping[str, Any], length: int, autocast: Any = None
) -> MemoryNeed:
    """The :class:`MemoryNeed` of ``model``, measured at ``length`` itself when it is no longer than
    the :data:`PROBE_LENGTHS`, else at those and extrapolated."""
    lengths = [length] if length <= PROBE_LENGTHS[-1] else list(PROBE_LENGTHS)
    return fit_need([(n, forward_peak(model, head, n, autocast)) for n in lengths])
