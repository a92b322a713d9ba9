"""torchrun support: process group, device per rank, and the few collectives the trainer uses.

``torchrun --nproc_per_node N -m aiayn train ...`` sets ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK``; the process then joins a process group (NCCL on CUDA, gloo on CPU). A plain
``aiayn train`` is a world of one and none of this costs anything.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from aiayn.runtime.devices import resolve_device

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device_preference: str) -> tuple[DistInfo, torch.device]:
    """Join the torchrun process group if there is one; the device this rank uses."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_preference, local, field="train.device")
    if world <= 1:
        return DistInfo(), device
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=30))
        log.info("rank %d/%d joined the %s process group on %s", rank, world, backend, device)
    return DistInfo(rank=rank, world_size=world, local_rank=local), device


def cleanup() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _collective_device(device: torch.device) -> torch.device:
    # NCCL only moves CUDA tensors; gloo only CPU ones.
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return device
    return torch.device("cpu")


def all_reduce_sum(values: list[float], info: DistInfo, device: torch.device) -> list[float]:
    """Element-wise sum over ranks (float64; counts stay exact below 2^53)."""
    if not info.enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=_collective_device(device))
    dist.all_reduce(t)
    return t.tolist()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def all_gather_json(value: Any, info: DistInfo, device: torch.device) -> list[Any]:
    """Gather one JSON-serialisable value from every rank (as UTF-8 bytes, no pickling)."""
    if not info.enabled:
        return [value]
    dev = _collective_device(device)
    data = json.dumps(value).encode("utf-8")
    size = torch.tensor([len(data)], dtype=torch.int64, device=dev)
    sizes = [torch.zeros_like(size) for _ in range(info.world_size)]
    dist.all_gather(sizes, size)
    longest = int(max(s.item() for s in sizes))
    buf = torch.zeros(longest, dtype=torch.uint8, device=dev)
    buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
    bufs = [torch.zeros_like(buf) for _ in range(info.world_size)]
    dist.all_gather(bufs, buf)
    return [json.loads(bytes(b[:int(s.item())].cpu().tolist()).decode("utf-8"))
            for b, s in zip(bufs, sizes)]
