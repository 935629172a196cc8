"""What the implementations of the complex diagonal scan share: the arguments' checks."""

from __future__ import annotations

from torch import Tensor


def check_inputs(log_decay: Tensor, inputs: Tensor, h0: Tensor | None, where: str) -> None:
    """A ValueError naming ``where`` and the argument at fault unless ``log_decay`` is (N,) complex,
    ``inputs`` (..., L, N) complex and ``h0`` None or (..., N)."""
    if not log_decay.is_complex() or not inputs.is_complex():
        raise ValueError(f"{where}: log_decay and inputs must be complex, got {log_decay.dtype} and {inputs.dtype}")
    if inputs.dim() < 2:
        raise ValueError(f"{where}: inputs must have shape (..., length, N), got {tuple(inputs.shape)}")
    if log_decay.dim() != 1 or log_decay.shape[0] != inputs.shape[-1]:
        raise ValueError(
            f"{where}: log_decay must have shape (N,) = ({inputs.shape[-1]},) to match inputs {tuple(inputs.shape)}, "
            f"got {tuple(log_decay.shape)}"
        )
    if h0 is not None and (tuple(h0.shape) != tuple(inputs.shape[:-2]) + tuple(inputs.shape[-1:])):
        expected = tuple(inputs.shape[:-2]) + tuple(inputs.shape[-1:])
        raise ValueError(f"{where}: h0 must have shape {expected}, got {tuple(h0.shape)}")


def check_chunk_size(chunk_size: object, where: str) -> None:
    """A ValueError naming ``where`` unless ``chunk_size`` is None or an integer >= 2."""
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 2):
        raise ValueError(f"{where}: chunk_size must be an integer >= 2, got {chunk_size!r}")
