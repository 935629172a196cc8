"""The GPUs ``longrange plan`` plans for: memory, memory bandwidth and peak dense FLOP/s, from the
vendor's documents.

Every figure is the vendor's peak for dense operands (NVIDIA's datasheets print the tensor-core
figures of the data-centre parts *with* 2:4 structured sparsity, marked with an asterisk; the dense
figure is half of it, which is what dense training reaches at best). ``fp32`` is the rate of the
CUDA cores (no tensor cores), ``tf32`` and ``bf16`` those of the tensor cores (bf16 with float32
accumulation, as PyTorch's matrix products use: on the GeForce cards that is half the rate of
float16 accumulation). ``memory_gb`` is the memory on the datasheet, which counts in GiB
(``nvidia-smi`` shows 40960 MiB on an A100 40GB).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from longrange.errors import ConfigError

TERA = 1e12


@dataclass(frozen=True)
class GPU:
    """A GPU's peak figures (FLOP/s, bytes/s, bytes) and where they come from."""

    key: str
    name: str
    memory_gb: float  # GiB, as the datasheet's "GB"
    bandwidth: float  # bytes/s
    fp32: float  # FLOP/s, CUDA cores
    tf32: float  # FLOP/s, tensor cores, dense
    bf16: float  # FLOP/s, tensor cores, dense, float32 accumulation (fp16 alike)
    source: str

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 2**30)

    def to_dict(self) -> dict:
        return {**asdict(self), "memory_bytes": self.memory_bytes}


_H100 = "NVIDIA H100 Tensor Core GPU Datasheet (tensor-core figures printed with sparsity, halved here)"
_A100 = "NVIDIA A100 Tensor Core GPU Datasheet (tensor-core figures printed with sparsity, halved here)"

#: The GPUs by key, in the order ``longrange plan --gpu`` lists them.
GPUS: dict[str, GPU] = {
    g.key: g
    for g in (
        GPU("h100-sxm", "NVIDIA H100 SXM 80GB", 80, 3.35e12, 67 * TERA, 494.7 * TERA, 989.4 * TERA, _H100),
        GPU("h100-pcie", "NVIDIA H100 PCIe 80GB", 80, 2.0e12, 51 * TERA, 378 * TERA, 756 * TERA, _H100),
        GPU(
            "h200",
            "NVIDIA H200 SXM 141GB",
            141,
            4.8e12,
            67 * TERA,
            494.7 * TERA,
            989.4 * TERA,
            "NVIDIA H200 Tensor Core GPU Datasheet (tensor-core figures printed with sparsity, halved here)",
        ),
        GPU("a100-40gb", "NVIDIA A100 SXM 40GB", 40, 1.555e12, 19.5 * TERA, 156 * TERA, 312 * TERA, _A100),
        GPU("a100-80gb", "NVIDIA A100 SXM 80GB", 80, 2.039e12, 19.5 * TERA, 156 * TERA, 312 * TERA, _A100),
        GPU(
            "l4",
            "NVIDIA L4 24GB",
            24,
            300e9,
            30.3 * TERA,
            60 * TERA,
            121 * TERA,
            "NVIDIA L4 Tensor Core GPU Datasheet (tensor-core figures printed with sparsity, halved here)",
        ),
        GPU(
            "rtx-4090",
            "NVIDIA GeForce RTX 4090 24GB",
            24,
            1008e9,
            82.6 * TERA,
            82.6 * TERA,
            165.2 * TERA,
            "NVIDIA Ada GPU Architecture whitepaper, Appendix A (GeForce RTX 4090: dense FP16/BF16 tensor with "
            "FP32 accumulate, dense TF32 tensor, FP32)",
        ),
        GPU(
            "rtx-3090",
            "NVIDIA GeForce RTX 3090 24GB",
            24,
            936e9,
            35.6 * TERA,
            35.6 * TERA,
            71 * TERA,
            "NVIDIA Ampere GA102 GPU Architecture whitepaper, Appendix A (GeForce RTX 3090: dense FP16/BF16 tensor "
            "with FP32 accumulate, dense TF32 tensor, FP32)",
        ),
    )
}


def _plain(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


#: Other spellings of the keys (compared without spaces, dashes or case): "H100 SXM5", "A100 80", "4090".
_ALIASES = {
    "h100sxm5": "h100-sxm",
    "h100sxm80gb": "h100-sxm",
    "h100pcie80gb": "h100-pcie",
    "h200sxm": "h200",
    "h200141gb": "h200",
    "a10040": "a100-40gb",
    "a10080": "a100-80gb",
    "a100sxm40gb": "a100-40gb",
    "a100sxm80gb": "a100-80gb",
    "4090": "rtx-4090",
    "3090": "rtx-3090",
    "geforcertx4090": "rtx-4090",
    "geforcertx3090": "rtx-3090",
    # the names torch.cuda.get_device_name() gives
    "nvidiah10080gbhbm3": "h100-sxm",
    "nvidiah100pcie": "h100-pcie",
    "nvidiah200": "h200",
    "nvidiaa100sxm440gb": "a100-40gb",
    "nvidiaa100sxm480gb": "a100-80gb",
    "nvidial4": "l4",
    "nvidiageforcertx4090": "rtx-4090",
    "nvidiageforcertx3090": "rtx-3090",
}


def find_gpu(name: str) -> GPU:
    """The GPU named ``name`` (a key, its name, or a spelling of either without spaces, dashes or
    case); a ConfigError listing the known GPUs otherwise."""
    wanted = _plain(name)
    for gpu in GPUS.values():
        if wanted in (_plain(gpu.key), _plain(gpu.name)):
            return gpu
    if wanted in _ALIASES:
        return GPUS[_ALIASES[wanted]]
    known = ", ".join(f"{g.key} ({g.name})" for g in GPUS.values())
    raise ConfigError(f"unknown GPU {name!r}; known GPUs: {known}")
