"""How fast the learned convolution kernels of SSM layers decay (the SPT paper's kernel analysis).

For every sequence primitive of ``model.backbone.mixers()`` that has a ``kernel(L)`` method (S4,
S4D, DLR), the kernel K of shape (channels, H, L) is read — channels is 1 for a causal layer and
2 for a two-sided one (forward kernel, then backward kernel); an (H, L) kernel is taken as one
channel. A :class:`~longrange.layers.bidirectional.FlipSum` of two primitives with kernels gives
its forward and backward kernels the same way.

Per layer and direction:

* the **envelope** ``e_l = mean_h |K[h, l]| / max_l' mean_h |K[h, l']|`` (1 at its peak);
* the **centre of mass** ``Σ_l l·e_l / Σ_l e_l``: the mean lag the kernel weighs, in steps;
* the **cutoff** ``min {l > argmax e : e_l < threshold}`` (threshold 0.1 by default): where the
  envelope first falls below 10% of its peak after it; None if it never does within L.

Lags ``l`` are kernel indices starting at 0. For a forward kernel index l weighs the input l steps
back; for a two-sided layer's backward kernel, index j weighs the input j + 1 steps ahead (the
convention of ``ops/fftconv.py``); for a FlipSum backward primitive, index l weighs l steps ahead.
An all-zero kernel has a zero envelope and NaN centre of mass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

DIRECTION_NAMES = ("forward", "backward")


@dataclass
class KernelProfile:
    """The decay of one layer's kernel in one direction."""

    layer: int  # index in model.backbone.mixers() (a bidirectional Mamba block has one per branch)
    name: str  # module path inside the model, e.g. "backbone.blocks.0.mixer"
    primitive: str  # class name, e.g. "S4D"
    direction: str  # "forward" or "backward"
    envelope: np.ndarray  # (L,) float64, max 1 (or all 0)
    centre_of_mass: float
    cutoff: int | None
    threshold: float


@dataclass
class KernelReport:
    """Profiles of the layers with kernels, and the primitives without one."""

    profiles: list[KernelProfile]
    without_kernel: list[tuple[int, str, str]]  # (layer, module path, class name)
    length: int

    @property
    def has_kernels(self) -> bool:
        return bool(self.profiles)

    def message(self) -> str:
        """One line saying which layers have no convolution kernel (empty if all have one)."""
        if not self.without_kernel:
            return ""
        kinds = sorted({cls for _, _, cls in self.without_kernel})
        if not self.profiles:
            return (
                f"no convolution kernels: the model's primitives ({', '.join(kinds)}) have no kernel(L) "
                "method (input-dependent or attention layers), so there is no kernel decay to analyse"
            )
        layers = ", ".join(str(i) for i, _, _ in self.without_kernel)
        return f"layers {layers} ({', '.join(kinds)}) have no convolution kernel and are left out"


def _as_channels(K: Any, owner: str, L: int) -> Tensor:
    if not isinstance(K, Tensor):
        raise TypeError(f"{owner}.kernel({L}) returned {type(K).__name__}, expected a tensor")
    if K.dim() == 2:
        K = K.unsqueeze(0)
    if K.dim() != 3 or K.shape[0] not in (1, 2) or K.shape[-1] != L:
        raise ValueError(
            f"{owner}.kernel({L}) has shape {tuple(K.shape)}; expected (H, {L}), (1, H, {L}) or (2, H, {L})"
        )
    if K.is_complex():
        raise ValueError(f"{owner}.kernel({L}) is complex; expected a real kernel")
    return K


def layer_kernel(mixer: nn.Module, L: int) -> Tensor | None:
    """The (channels, H, L) kernel of a primitive, or None if it has no convolution kernel."""
    owner = type(mixer).__name__
    fn = getattr(mixer, "kernel", None)
    if callable(fn):
        return _as_channels(fn(L), owner, L)
    fwd, bwd = getattr(mixer, "fwd", None), getattr(mixer, "bwd", None)
    if isinstance(fwd, nn.Module) and isinstance(bwd, nn.Module):
        kf, kb = layer_kernel(fwd, L), layer_kernel(bwd, L)
        if kf is not None and kb is not None:
            return torch.cat([kf[:1], kb[:1]], dim=0)
    return None


def envelope(K: Tensor) -> np.ndarray:
    """(channels, H, L) kernel -> (channels, L) float64 envelope: mean over H of |K|, over its max."""
    if K.dim() != 3:
        raise ValueError(f"envelope expects a (channels, H, L) kernel, got shape {tuple(K.shape)}")
    e = K.detach().to("cpu", torch.float64).abs().mean(dim=1).numpy()
    peak = e.max(axis=-1, keepdims=True)
    return np.divide(e, peak, out=np.zeros_like(e), where=peak > 0)


def centre_of_mass(env: np.ndarray) -> float:
    """``Σ l·e_l / Σ e_l`` over lags l = 0..L-1 (NaN for an all-zero envelope)."""
    total = float(env.sum())
    if total <= 0:
        return float("nan")
    return float((np.arange(env.shape[-1]) * env).sum() / total)


def cutoff(env: np.ndarray, threshold: float = 0.1) -> int | None:
    """First lag after the peak where the envelope is below ``threshold`` (None if never)."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"cutoff threshold must be in (0, 1), got {threshold}")
    if not (env > 0).any():
        return None
    peak = int(np.argmax(env))
    below = np.nonzero(env[peak:] < threshold)[0]
    return int(peak + below[0]) if below.size else None


def _mixer_names(model: nn.Module, mixers: list[nn.Module]) -> list[str]:
    names = {id(m): n for n, m in model.named_modules()}
    return [names.get(id(m), f"mixer {i}") for i, m in enumerate(mixers)]


@torch.no_grad()
def kernel_decay(model: nn.Module, length: int, threshold: float = 0.1) -> KernelReport:
    """Kernel decay profiles of every layer of ``model.backbone.mixers()`` with a kernel.

    ``model`` is a :class:`~longrange.models.model.SequenceModel` (anything with
    ``backbone.mixers()``); ``length`` is the kernel length L (the task's sequence length).
    Layers without kernels are listed in :attr:`KernelReport.without_kernel`, never an error.
    """
    if not isinstance(length, int) or length < 1:
        raise ValueError(f"kernel length must be a positive integer, got {length!r}")
    backbone = getattr(model, "backbone", None)
    if backbone is None or not hasattr(backbone, "mixers"):
        raise TypeError(f"{type(model).__name__} has no backbone.mixers(); expected a SequenceModel")
    mixers = list(backbone.mixers())
    names = _mixer_names(model, mixers)
    profiles, without = [], []
    for i, (mixer, name) in enumerate(zip(mixers, names)):
        K = layer_kernel(mixer, length)
        if K is None:
            without.append((i, name, type(mixer).__name__))
            continue
        env = envelope(K)
        for ch in range(env.shape[0]):
            profiles.append(
                KernelProfile(
                    layer=i,
                    name=name,
                    primitive=type(mixer).__name__,
                    direction=DIRECTION_NAMES[ch],
                    envelope=env[ch],
                    centre_of_mass=centre_of_mass(env[ch]),
                    cutoff=cutoff(env[ch], threshold),
                    threshold=threshold,
                )
            )
    return KernelReport(profiles, without, length)
