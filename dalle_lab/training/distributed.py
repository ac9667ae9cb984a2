"""Process-group facts and the few collectives the training loop needs.

Works unchanged in one process (nothing is initialised, every collective is the identity) and under
`torchrun --nproc_per_node N` or the `deepspeed` launcher, which set RANK / WORLD_SIZE / LOCAL_RANK.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def env_dist_info() -> DistInfo:
    """Rank and world size as a launcher (torchrun, deepspeed) announced them; one process otherwise."""
    return DistInfo(
        rank=int(os.environ.get("RANK", 0)),
        world_size=int(os.environ.get("WORLD_SIZE", 1)),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
    )


def process_device(device, info: DistInfo):
    """This process's device: with several processes a bare "cuda" becomes cuda:LOCAL_RANK (one GPU per process, as
    NCCL needs); an explicit index or a CPU is kept."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and device.index is None and info.distributed:
        return torch.device("cuda", info.local_rank)
    return device


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def set_single_process_env() -> None:
    """DeepSpeed without a launcher looks for MPI unless these are set; a lone process needs no launcher."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")


def init_process_group(info: DistInfo, device) -> None:
    """Plain (non-DeepSpeed) multi-process runs: gloo on CPU, nccl on CUDA."""
    import torch
    import torch.distributed as dist

    if not info.distributed or dist.is_initialized():
        return
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, rank=info.rank, world_size=info.world_size)


def _initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def barrier() -> None:
    import torch.distributed as dist

    if _initialized():
        dist.barrier()


def all_reduce_mean(values, device="cpu"):
    """Mean over ranks of a list of floats (the identity in one process)."""
    import torch
    import torch.distributed as dist

    if not _initialized() or dist.get_world_size() == 1:
        return list(values)
    tensor = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return (tensor / dist.get_world_size()).tolist()


def any_rank(flag: bool, device="cpu") -> bool:
    """True when `flag` is true on at least one rank, so all ranks take the same branch."""
    import torch
    import torch.distributed as dist

    if not _initialized() or dist.get_world_size() == 1:
        return flag
    tensor = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item() > 0)


def gather_objects(obj) -> list:
    """Every rank's `obj`, in rank order, on every rank (a one-element list in one process)."""
    import torch.distributed as dist

    if not _initialized() or dist.get_world_size() == 1:
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj):
    """Rank 0's `obj` on every rank."""
    import torch.distributed as dist

    if not _initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
