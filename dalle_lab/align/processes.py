"""Several processes, one result: what alignment needs from torch.distributed.

Under `torchrun --nproc_per_node N` (or the `deepspeed` launcher, which sets the same RANK / WORLD_SIZE variables)
every process runs the same trainer. The design makes the result independent of how the work is split:

- each epoch's samples are cut into chunks of `sample_batch_size`, chunk c is sampled by process c mod N from a
  generator seeded by (seed, epoch, chunk), so the same tokens come out whatever the number of processes;
- the trajectories (tokens, recorded log-probs, supports, rewards) are gathered into the global epoch in chunk order,
  so per-prompt statistics see every process's samples and every process holds the same advantages;
- an optimizer step covers `train_batch_size x N x gradient_accumulation_steps` samples: each process takes its
  micro-batches of the step, scales each micro-batch's loss by its share of the step's samples, accumulates
  gradients locally and sums them across processes once per step (one all-reduce), then clips and steps;
- only process 0 writes logs, plots and checkpoints.

In one process every collective here is the identity.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from dalle_lab.training.distributed import env_dist_info, init_process_group



class Processes:
    """Rank, world size and the few collectives the trainers use."""

    def __init__(self, device):
        self.info = info = env_dist_info()  # rank, world size and is_main / distributed: one definition
        self.rank, self.world_size = info.rank, info.world_size
        self.device = torch.device(device)
        if self.world_size > 1:
            if self.device.type == "cuda":
                if self.device.index is None:  # every process would land on the same GPU and NCCL would refuse it
                    raise ValueError(f"{self.world_size} processes on CUDA: put each process's model on its own GPU, "
                                     f"cuda:LOCAL_RANK (this is process {self.rank}, LOCAL_RANK {info.local_rank})")
                torch.cuda.set_device(self.device)
            init_process_group(info, self.device)

    @property
    def is_main(self) -> bool:
        return self.info.is_main

    @property
    def distributed(self) -> bool:
        return self.info.distributed

    def my_share(self, items: list) -> list:
        """This process's items of a list dealt round-robin (item i goes to process i mod N)."""
        return items[self.rank::self.world_size]

    def broadcast_parameters(self, params) -> None:
        """Process 0's values in every process (the same start, whatever each process initialised)."""
        if not self.distributed:
            return
        with torch.no_grad():
            for p in params:
                dist.broadcast(p.data, src=0)

    def sum_gradients(self, params) -> None:
        """Sum each parameter's gradient over processes, in one flat all-reduce (missing gradients count as 0)."""
        if not self.distributed:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = flat[offset:offset + n].view_as(p).clone()
            offset += n

    def sum_floats(self, values: list[float]) -> list[float]:
        """Element-wise sum of a list of floats over processes (float64)."""
        if not self.distributed:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=self._collective_device())
        dist.all_reduce(tensor)
        return tensor.cpu().tolist()

    def max_float(self, value: float) -> float:
        if not self.distributed:
            return value
        tensor = torch.tensor([value], dtype=torch.float64, device=self._collective_device())
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return float(tensor.item())

    def any(self, flag: bool) -> bool:
        """True when `flag` holds on any process, so every process takes the same branch."""
        return self.max_float(1.0 if flag else 0.0) > 0

    def gather_objects(self, obj) -> list:
        """Every process's `obj` in rank order (CPU tensors inside are fine)."""
        if not self.distributed:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def _collective_device(self):
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")
