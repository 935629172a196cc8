"""Data parallelism with PyTorch's DistributedDataParallel, launched by ``torchrun``.

``torchrun --nproc_per_node=K script.py`` starts K processes with RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT set; :func:`init_distributed` reads them and joins the process group
(nccl on CUDA, gloo on CPU). Without those variables (or with WORLD_SIZE=1) everything runs in one
process and the collective helpers below do nothing.

Only rank 0 writes files and shows progress (:func:`is_main_process`).
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from longrange.errors import ConfigError


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device | None = None
    #: True when :func:`init_distributed` created the process group (and so should destroy it).
    owns_group: bool = False

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name} must be an integer, got {raw!r}") from None


def default_device(local_rank: int = 0) -> torch.device:
    """The accelerator of this process if there is one, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def init_distributed(device: torch.device | str | None = None) -> DistEnv:
    """Join the process group described by the torchrun environment (idempotent).

    ``device`` defaults to ``cuda:LOCAL_RANK`` when CUDA is available, else the CPU.
    """
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        local = _env_int("LOCAL_RANK", rank)
        dev = torch.device(device) if device is not None else default_device(local)
        return DistEnv(rank, world, local, dev, owns_group=False)
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local = _env_int("LOCAL_RANK", rank)
    dev = torch.device(device) if device is not None else default_device(local)
    if world <= 1:
        return DistEnv(0, 1, 0, dev, owns_group=False)
    if not dist.is_available():
        raise ConfigError("WORLD_SIZE > 1 but this PyTorch build has no torch.distributed")
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise ConfigError(f"WORLD_SIZE={world} but {var} is not set; launch with torchrun")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, rank=rank, world_size=world)
    return DistEnv(rank, world, local, dev, owns_group=True)


def cleanup(env: DistEnv | None = None) -> None:
    """Leave the process group if :func:`init_distributed` created it (or if ``env`` is None)."""
    if dist.is_available() and dist.is_initialized() and (env is None or env.owns_group):
        # All ranks reach this point before any tears the group down: destroying it while a peer
        # is still inside a gloo operation can abort that peer's process at exit.
        dist.barrier()
        _let_gloo_finish()
        dist.destroy_process_group()


def _let_gloo_finish() -> None:
    """Wait, without holding Python's lock, until the process group's threads have finished their
    work. Gloo's thread releases the last references of a finished operation after the operation
    completes, and a tensor that Python also referenced needs Python's lock to be freed; the group's
    destructor, called holding that lock, waits for the thread: a deadlock at exit, seen in about
    one run in six of two CPU processes here."""
    group = dist.distributed_c10d._get_default_group()
    wait = getattr(group, "_wait_for_pending_works", None)
    if wait is not None:
        try:
            wait()
        except RuntimeError:  # a backend without it
            pass
    gc.collect()
    time.sleep(0.05)  # releases Python's lock while gloo's thread drops what it still holds


@contextmanager
def process_group(device: torch.device | str | None = None) -> Iterator[DistEnv]:
    """Join the torchrun process group for the duration of the block (nothing without torchrun);
    leave it at the end if it was joined here."""
    env = init_distributed(device)
    try:
        yield env
    finally:
        cleanup(env)


def is_main_process() -> bool:
    """Rank 0 of the process group, or of the launch (``RANK``) once the group is gone."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return _env_int("RANK", 0) == 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def all_reduce_sums(sums: Mapping[str, torch.Tensor] | None, device: torch.device) -> dict[str, torch.Tensor]:
    """Add metric sums over all ranks. Ranks may hold different keys (e.g. no data): missing = 0.

    Returns float64 CPU tensors.
    """
    sums = dict(sums or {})
    if world_size() == 1:
        return {k: v.detach().to("cpu", torch.float64) for k, v in sums.items()}
    shape_lists: list[Any] = [None] * world_size()
    dist.all_gather_object(shape_lists, {k: tuple(v.shape) for k, v in sums.items()})
    shapes: dict[str, tuple[int, ...]] = {}
    for per_rank in shape_lists:
        for k, shape in per_rank.items():
            if shapes.setdefault(k, shape) != shape:
                raise ValueError(f"metric sum {k!r} has shape {shape} on one rank and {shapes[k]} on another")
    keys = sorted(shapes)
    # One flat float64 vector, so a single collective carries every sum (nccl needs CUDA tensors).
    parts = [
        sums[k].detach().to(device, torch.float64).reshape(-1)
        if k in sums
        else torch.zeros(shapes[k], dtype=torch.float64, device=device).reshape(-1)
        for k in keys
    ]
    packed = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64, device=device)
    dist.all_reduce(packed, op=dist.ReduceOp.SUM)
    out, offset = {}, 0
    for k in keys:
        size = int(torch.Size(shapes[k]).numel())
        out[k] = packed[offset : offset + size].reshape(shapes[k]).to("cpu")
        offset += size
    return out


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (one per rank, in rank order)."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


class DelegatingDDP(DistributedDataParallel):
    """DistributedDataParallel that answers unknown attribute lookups from the wrapped model."""

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)


def wrap_model(model: torch.nn.Module, device: torch.device, find_unused_parameters: bool = False) -> torch.nn.Module:
    """``model`` in :class:`DelegatingDDP` when running distributed, else ``model`` itself.

    Objectives read model properties (``model.causal``, ``model.config``) the same way in both
    cases. Gradients are synchronised for calls of ``forward`` (``model(...)``) only.
    """
    if world_size() == 1:
        return model
    return DelegatingDDP(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        find_unused_parameters=find_unused_parameters,
    )
