"""Generation speed: recurrent ``step`` against recomputing the forward pass over the prefix.

For each causal model (built with a token encoder and a token head over ``vocab_size`` symbols,
batch ``batch_size``, eval mode, no gradients) tokens are generated greedily from a random first
token by ``model.step``, one position at a time. The per-token latency at position p is the mean
wall-clock time of the steps in the window of ``window`` positions starting at p - window/2 (the
step at index t consumes the token at position t); tokens/s = batch_size / latency.

The naive way ("recompute") runs the parallel forward over the whole prefix (positions 0..p) to
get the next token at position p: one untimed call, then the mean of ``naive_repeats`` timed calls.
It is measured at a few positions only, since each call costs a full forward pass.

Recurrent SSMs carry a fixed-size state, so their step latency should not grow with position;
attention's KV cache grows by one key and value per step, so its latency grows with position.
The size of the recurrent state (bytes of all its tensors) is reported at each position.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from longrange.bench import measure
from longrange.bench.models import error_summary, resolve_model
from longrange.errors import ConfigError, LongrangeError

#: Models measured by default: each SSM in its thesis block, DLR, and the Transformer (KV cache).
GENERATION_MODELS = ("mamba-s6", "mamba-s4d", "mamba-s4", "simple-s4d", "dlr", "transformer")


@dataclass
class GenerationSettings:
    positions: tuple[int, ...] = (64, 1024, 8192)
    window: int = 32
    naive_positions: tuple[int, ...] = (64, 1024, 8192)
    naive_repeats: int = 2
    batch_size: int = 1
    vocab_size: int = 256
    #: Override the models' number of layers (None: as named).
    n_layers: int | None = None
    device: str = "auto"
    seed: int = 0
    #: torch threads in the measurement process; None: torch's default (see docs/performance.md).
    threads: int | None = 1

    def __post_init__(self) -> None:
        self.positions = tuple(self.positions)
        self.naive_positions = tuple(self.naive_positions)

    def validate(self) -> None:
        if not self.positions:
            raise ConfigError("--positions: need at least one position")
        if any(p < 0 for p in self.positions + self.naive_positions):
            raise ConfigError(f"positions must be >= 0, got {self.positions} and {self.naive_positions}")
        for name in ("window", "naive_repeats", "batch_size", "vocab_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads must be positive, got {self.threads}")
        if self.n_layers is not None and self.n_layers < 1:
            raise ConfigError(f"--layers must be positive, got {self.n_layers}")
        measure.resolve_device(self.device)

    def window_of(self, position: int) -> range:
        start = max(0, position - self.window // 2)
        return range(start, start + self.window)


def state_bytes(state: Any) -> int:
    """Bytes held by all tensors in a (nested) recurrent state: dicts, sequences, dataclasses."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        return sum(state_bytes(getattr(state, f.name)) for f in dataclasses.fields(state))
    return 0


def build_generator(config: dict[str, Any], settings: GenerationSettings, name: str = "model"):
    """A causal token model for generation; a clear error for a bidirectional config."""
    from longrange.models import ModelConfig, build_model

    cfg = ModelConfig.from_dict(config)
    if settings.n_layers is not None:
        cfg = cfg.replace(n_layers=settings.n_layers)
    if cfg.bidirectional:
        raise ConfigError(f"model {name!r} is bidirectional: it has no recurrent generation mode")
    v = settings.vocab_size
    return build_model(cfg, input_kind="tokens", vocab_size=v, head="tokens", n_out=v)


def measure_generation(name: str, config: dict[str, Any], settings: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows (one per position) for one model: step latency, recompute latency, state size."""
    s = GenerationSettings(**settings)
    s.validate()
    with measure.torch_threads(s.threads):
        return _measure_generation(name, config, s)


def _measure_generation(name: str, config: dict[str, Any], s: GenerationSettings) -> list[dict[str, Any]]:
    device = measure.resolve_device(s.device)
    torch.manual_seed(s.seed)
    model = build_generator(config, s, name).to(device).eval()
    windows = {p: s.window_of(p) for p in s.positions}
    timed_steps = set().union(*windows.values())
    n_steps = max(w.stop for w in windows.values())
    step_times: dict[int, float] = {}
    state_sizes: dict[int, int] = {}
    with torch.no_grad():
        token = torch.randint(0, s.vocab_size, (s.batch_size,), device=device)
        state = model.default_state(s.batch_size, device=device)
        for t in range(n_steps):
            timed = t in timed_steps
            if timed:
                measure.synchronize(device)
                start = time.perf_counter()
            logits, state = model.step(token, state)
            token = logits.argmax(-1)
            if timed:
                measure.synchronize(device)
                step_times[t] = time.perf_counter() - start
            if any(t == w.stop - 1 for w in windows.values()):
                state_sizes[t] = state_bytes(state)
        naive: dict[int, float] = {}
        for p in s.naive_positions:
            prefix = torch.randint(0, s.vocab_size, (s.batch_size, p + 1), device=device)

            def recompute() -> None:
                model(prefix)[:, -1].argmax(-1)

            naive[p] = measure.summarize_times(
                measure.time_calls(recompute, warmup=1, batches=s.naive_repeats, device=device)
            )["mean"]
    rows = []
    for p in sorted(set(s.positions) | set(s.naive_positions)):
        row: dict[str, Any] = {"model": name, "position": p, "batch_size": s.batch_size}
        if p in windows:
            latency = sum(step_times[t] for t in windows[p]) / len(windows[p])
            row.update(
                step_ms=1000.0 * latency,
                step_tok_per_s=s.batch_size / latency,
                state_kb=state_sizes[windows[p].stop - 1] / 1024.0,
            )
        if p in naive:
            row.update(recompute_ms=1000.0 * naive[p], recompute_tok_per_s=s.batch_size / naive[p])
        if "step_ms" in row and "recompute_ms" in row:
            row["speedup"] = row["recompute_ms"] / row["step_ms"]
        rows.append(row)
    return rows


def latency_growth(rows: list[dict[str, Any]], first: int, last: int) -> dict[str, float | None]:
    """Per model: step latency at position ``last`` over that at ``first`` (None if missing)."""
    by_model: dict[str, dict[int, float]] = {}
    for r in rows:
        if "step_ms" in r:
            by_model.setdefault(r["model"], {})[r["position"]] = r["step_ms"]
    return {m: (lat[last] / lat[first] if first in lat and last in lat else None) for m, lat in by_model.items()}


def run_generation(
    models: list[str] | tuple[str, ...] = GENERATION_MODELS,
    settings: GenerationSettings | None = None,
    *,
    isolate: bool = True,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Measure each model (in a fresh process with ``isolate``); rows of all models, in order.

    A model that fails gives one row with an ``error``; a bidirectional model is a user error.
    """
    settings = settings or GenerationSettings()
    settings.validate()
    entries = [resolve_model(m) for m in dict.fromkeys(models)]
    if not entries:
        raise ConfigError("no models to measure")
    for e in entries:
        if e.config.get("direction", "causal") == "bidirectional":
            raise ConfigError(f"model {e.name!r} is bidirectional: it has no recurrent generation mode")
    rows: list[dict[str, Any]] = []
    for i, entry in enumerate(entries):
        if progress is not None:
            progress(f"[{i + 1}/{len(entries)}] {entry.name}")
        try:
            rows.extend(
                measure.run_isolated(
                    "longrange.bench.generation:measure_generation",
                    {"name": entry.name, "config": entry.config, "settings": asdict(settings)},
                    isolate=isolate,
                )
            )
        except LongrangeError:
            raise
        except Exception as err:  # reported in the table, not skipped
            rows.append({"model": entry.name, "error": error_summary(err), "error_detail": str(err)})
    return rows
