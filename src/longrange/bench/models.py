"""The named models of the benchmarks and the throughput/memory table over them (``longrange bench``).

The named set follows the thesis' 600k-parameter Cifar10-numerical models (6 layers; Table 3):
Mamba blocks d=116, N=16; Simple blocks d=170, N=64; bidirectional Mamba widths from Table 6
(S6 d=107, S4D d=108), which keep the parameter count of the causal model; placebo blocks share
the bidirectional widths (same parameters, no flips); speed-matched widths S6 d=170, S4D d=140.
A name can also be the path of a YAML/JSON file holding a model config (the fields of
:class:`~longrange.models.ModelConfig`, at the top level or under a ``model`` key).

The workload is the thesis' (section 12.2.5): a fixed synthetic batch of shape
(batch, length, channels) of standard-normal values with random labels over 10 classes, no data
loader, ``torch.manual_seed`` before building each model and its batch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import yaml

from longrange.bench import measure
from longrange.errors import ConfigError, LongrangeError

_MAMBA = dict(block="mamba", n_layers=6, d_model=116, d_state=16)
_SIMPLE = dict(block="simple", n_layers=6, d_model=170, d_state=64)


@dataclass(frozen=True)
class NamedModel:
    name: str
    config: dict[str, Any]
    note: str = ""


def _entries() -> list[NamedModel]:
    m, s = _MAMBA, _SIMPLE
    return [
        NamedModel("mamba-s6", {**m, "primitive": "s6"}, "Table 3, the reference"),
        NamedModel("mamba-s4d", {**m, "primitive": "s4d"}, "Table 3"),
        NamedModel("mamba-s4", {**m, "primitive": "s4"}, "Table 3"),
        NamedModel("simple-s4d", {**s, "primitive": "s4d"}, "Table 3"),
        NamedModel("simple-s4", {**s, "primitive": "s4"}, "Table 3"),
        NamedModel("mamba-s6-bi", {**m, "primitive": "s6", "d_model": 107, "direction": "bidirectional"}, "Table 6"),
        NamedModel("mamba-s4d-bi", {**m, "primitive": "s4d", "d_model": 108, "direction": "bidirectional"}, "Table 6"),
        NamedModel(
            "mamba-s6-placebo",
            {**m, "primitive": "s6", "d_model": 107, "direction": "placebo"},
            "bidirectional's parameters, no flips",
        ),
        NamedModel(
            "mamba-s4d-placebo",
            {**m, "primitive": "s4d", "d_model": 108, "direction": "placebo"},
            "bidirectional's parameters, no flips",
        ),
        NamedModel("mamba-s6-rope", {**m, "primitive": "s6", "rope": True}, "RoPE before the SSM (section 14)"),
        NamedModel(
            "mamba-s6-rope-trainable",
            {**m, "primitive": "s6", "rope": True, "rope_trainable": True},
            "trainable RoPE frequencies",
        ),
        NamedModel("mamba-s4d-rope", {**m, "primitive": "s4d", "rope": True}, "RoPE before the SSM (section 14)"),
        NamedModel(
            "mamba-s4d-rope-trainable",
            {**m, "primitive": "s4d", "rope": True, "rope_trainable": True},
            "trainable RoPE frequencies",
        ),
        NamedModel("mamba-s6-sm", {**m, "primitive": "s6", "d_model": 170}, "speed-matched to mamba-s6-bi (Table 6)"),
        NamedModel(
            "mamba-s4d-sm", {**m, "primitive": "s4d", "d_model": 140}, "speed-matched to mamba-s4d-bi (Table 6)"
        ),
        NamedModel("mamba-dlr", {**m, "primitive": "dlr", "d_model": 125}, "DLR in the Mamba block, width for ~600k"),
        NamedModel("dlr", {**s, "primitive": "dlr", "d_model": 206}, "DLR in the Simple block, width for ~600k"),
        NamedModel(
            "transformer",
            {"block": "transformer", "primitive": "attention", "n_layers": 6, "d_model": 92, "n_heads": 4},
            "pre-norm Transformer, ~600k",
        ),
        NamedModel(
            "transformer-blocked",
            {
                "block": "transformer",
                "primitive": "attention",
                "n_layers": 6,
                "d_model": 92,
                "n_heads": 4,
                "attn_block_size": 256,
            },
            "local attention in blocks of 256",
        ),
    ]


#: The built-in model set, by name.
MODELS: dict[str, NamedModel] = {e.name: e for e in _entries()}

#: The default ``longrange bench`` selection: the thesis' Table 3 models, its bidirectionality
#: and RoPE comparisons (figures 15 and 17), plus DLR and the Transformer.
DEFAULT_MODELS = (
    "mamba-s6",
    "mamba-s4d",
    "mamba-s4",
    "simple-s4d",
    "simple-s4",
    "mamba-s6-bi",
    "mamba-s4d-bi",
    "mamba-s6-placebo",
    "mamba-s6-rope",
    "mamba-s6-rope-trainable",
    "mamba-s4d-rope",
    "mamba-s4d-rope-trainable",
    "mamba-s6-sm",
    "mamba-s4d-sm",
    "dlr",
    "transformer",
)


def _load_config_file(path: Path) -> dict[str, Any]:
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: not a readable model config: {err}") from err
    if isinstance(data, dict) and isinstance(data.get("model"), dict):
        data = data["model"]
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping of model fields (or a 'model' mapping), got {type(data).__name__}"
        )
    return data


def error_summary(err: BaseException) -> str:
    """One line for a table cell: the last line of the message (a child's exception), or its type."""
    lines = str(err).strip().splitlines()
    return lines[-1] if lines else type(err).__name__


def resolve_model(name: str) -> NamedModel:
    """A built-in model by name, or a model config file (.yaml, .yml, .json) by path."""
    if name in MODELS:
        return MODELS[name]
    path = Path(name)
    if path.suffix in (".yaml", ".yml", ".json"):
        if not path.is_file():
            raise ConfigError(f"model config file {path} does not exist")
        config = _load_config_file(path)
        from longrange.models import ModelConfig

        try:
            ModelConfig.from_dict(config)
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from err
        except TypeError as err:
            raise ConfigError(f"{path}: {err}") from err
        return NamedModel(path.stem, config, f"from {path}")
    raise ConfigError(f"unknown model {name!r}; known models: {', '.join(MODELS)} (or a .yaml/.json model config path)")


def build_classifier(config: dict[str, Any], channels: int, n_classes: int):
    """The benchmark model: numeric inputs of ``channels`` channels, a pooled classification head."""
    from longrange.models import ModelConfig, build_model

    return build_model(
        ModelConfig.from_dict(config), input_kind="numeric", d_input=channels, head="classify", n_out=n_classes
    )


@dataclass
class Workload(measure.Measurement):
    """The fixed synthetic batch and how many times it is run (with :class:`~longrange.bench.measure.Measurement`'s
    device, seed, threads and kernels)."""

    # Defaults sized for a CPU run of the default model set in minutes (S6's PyTorch scan is the
    # slowest part); ``full()`` is the thesis' size.
    batch_size: int = 2
    length: int = 1024
    channels: int = 3
    n_classes: int = 10
    precision: str = "float32"

    POSITIVE: ClassVar[tuple[str, ...]] = ("batch_size", "length", "channels", "n_classes", "batches")

    def validate(self) -> torch.device:
        device = super().validate()
        measure.resolve_precision(self.precision, device)
        return device

    @classmethod
    def full(cls, **overrides: Any) -> Workload:
        """The thesis' size: 200 batches of 64 x 1024 x 3."""
        return cls(**{"batch_size": 64, "length": 1024, "channels": 3, "warmup": 3, "batches": 200, **overrides})


def measure_model(name: str, config: dict[str, Any], workload: dict[str, Any]) -> dict[str, Any]:
    """One row of the table: build the model, measure inference then training on the workload.

    Runs in the measurement process (see :func:`measure.run_isolated`); arguments are JSON-able.
    """

    wl = Workload(**workload)
    wl.validate()
    with (
        measure.torch_threads(wl.threads),
        measure.scan_impl(wl.scan_impl, wl.device) as impl,
        measure.ssm_kernel_impl(wl.ssm_kernel_impl, wl.device) as kernel_impl,
    ):
        return {**_measure_model(name, config, wl), "scan_impl": impl, "ssm_kernel_impl": kernel_impl}


def _measure_model(name: str, config: dict[str, Any], wl: Workload) -> dict[str, Any]:
    from longrange.models import parameter_report

    device = measure.resolve_device(wl.device)
    dtype, autocast_dtype = measure.resolve_precision(wl.precision, device)
    torch.manual_seed(wl.seed)
    model = build_classifier(config, wl.channels, wl.n_classes).to(device=device, dtype=dtype)
    report = parameter_report(model)
    inputs = torch.randn(wl.batch_size, wl.length, wl.channels, device=device, dtype=dtype)
    labels = torch.randint(0, wl.n_classes, (wl.batch_size,), device=device)

    def loss_fn(logits: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits.float(), labels)

    figures = measure.measure_train_and_infer(
        model, inputs, loss_fn, warmup=wl.warmup, batches=wl.batches, device=device, autocast_dtype=autocast_dtype
    )
    tokens = wl.batch_size * wl.length
    row: dict[str, Any] = {
        "model": name,
        "params": report["total"],
        "params_in_primitives": report["in_primitives"],
    }
    for phase in ("train", "infer"):
        f = figures[phase]
        row[f"{phase}_s_per_batch"] = f["mean"]
        row[f"{phase}_s_per_batch_std"] = f["std"]
        row[f"{phase}_seq_per_s"] = wl.batch_size / f["mean"]
        row[f"{phase}_tok_per_s"] = tokens / f["mean"]
        row[f"{phase}_peak_mb"] = f["peak_bytes"] / (1024.0 * 1024.0)
    row.update(
        batch_size=wl.batch_size,
        length=wl.length,
        channels=wl.channels,
        warmup=wl.warmup,
        batches=wl.batches,
        device=str(device),
        precision=wl.precision,
        threads=torch.get_num_threads(),
        memory_method=figures["memory_method"],
    )
    return row


#: (relative column, absolute column): speeds relative by throughput, memory by peak.
RELATIVE_COLUMNS = {
    "train_speed_pct": "train_seq_per_s",
    "train_mem_pct": "train_peak_mb",
    "infer_speed_pct": "infer_seq_per_s",
    "infer_mem_pct": "infer_peak_mb",
}


def add_relative_columns(rows: list[dict[str, Any]], reference: str) -> None:
    """Add ``*_pct`` columns: each row's throughput and peak memory as % of the reference row's.

    Rows that failed (with an ``error``) get None; a reference figure of 0 (memory below the
    measurement's resolution) gives None instead of a division by zero.
    """
    ref = next((r for r in rows if r["model"] == reference), None)
    if ref is None:
        raise ConfigError(
            f"reference model {reference!r} is not among the measured models {[r['model'] for r in rows]}"
        )
    if "error" in ref:
        raise ConfigError(f"reference model {reference!r} failed, so no relative figures: {ref['error']}")
    for row in rows:
        for rel, col in RELATIVE_COLUMNS.items():
            if "error" in row or not ref[col]:
                row[rel] = None
            elif row is ref:
                row[rel] = 100.0  # exactly, not x/x*100 rounded
            else:
                row[rel] = 100.0 * row[col] / ref[col]


def run_bench(
    models: list[str] | tuple[str, ...] = DEFAULT_MODELS,
    workload: Workload | None = None,
    *,
    reference: str = "mamba-s6",
    isolate: bool = True,
    progress=None,
) -> list[dict[str, Any]]:
    """Measure each model and return the table as a list of rows (dicts), in the given order.

    The reference is measured too if it is not in ``models`` (it is then placed first). A model
    that fails to build or run gives a row with an ``error`` message and no figures; a failing
    reference raises. ``isolate`` runs each model in a fresh process (comparable memory figures,
    and a crash does not end the run). ``progress(message)`` is called before each model.
    """
    workload = workload or Workload()
    workload.validate()
    names = list(dict.fromkeys(models))
    if not names:
        raise ConfigError("no models to measure")
    entries = [resolve_model(n) for n in names]
    ref_entry = resolve_model(reference)
    if ref_entry.name not in [e.name for e in entries]:
        entries.insert(0, ref_entry)
    rows: list[dict[str, Any]] = []
    for i, entry in enumerate(entries):
        if progress is not None:
            progress(f"[{i + 1}/{len(entries)}] {entry.name}")
        try:
            row = measure.run_isolated(
                "longrange.bench.models:measure_model",
                {"name": entry.name, "config": entry.config, "workload": asdict(workload)},
                isolate=isolate,
            )
        except LongrangeError:
            raise
        except Exception as err:  # a model that cannot run is reported in its row, not skipped
            row = {"model": entry.name, "error": error_summary(err), "error_detail": str(err)}
        row["note"] = entry.note
        rows.append(row)
    add_relative_columns(rows, ref_entry.name)
    return rows


__all__ = [
    "DEFAULT_MODELS",
    "MODELS",
    "NamedModel",
    "Workload",
    "add_relative_columns",
    "build_classifier",
    "measure_model",
    "resolve_model",
    "run_bench",
]
