"""One optimizer step from micro-batches: the same update in one process or several, plain PyTorch or DeepSpeed.

A step covers `index`, the global positions of its samples (train_batch_size x processes x gradient_accumulation_steps
of them; an epoch's last step may hold fewer). It is cut into micro-batches of train_batch_size, dealt round-robin
over processes. The caller's `loss_of(micro, share)` returns the micro-batch's mean loss times `share`, its share of
the step's samples, so the losses of every process's micro-batches sum to the step's mean loss and the summed
gradient is that of one process holding the whole step.

- Plain PyTorch: each process accumulates its micro-batches locally, then one flat all-reduce (sum) per step, clip
  and step (processes.py).
- DeepSpeed (`deepspeed_zero_stage` 0, 1 or 2; the training package's DeepSpeedEngine builds the engine and packs its
  checkpoints). Every forward runs through the engine (ClosureModule), as DeepSpeed's API asks. The accumulation
  boundary is set explicitly on the step's last micro-batch: DeepSpeed's gradient_accumulation_steps is a full step's
  count, and a shorter last step ends where its micro-batches end. DeepSpeed averages gradients over processes where
  we need their sum, so each loss is multiplied by the number of processes (exact for powers of two). ZeRO-2 reduces
  inside every backward, a collective, so every process runs as many backward passes per step: one with fewer
  micro-batches runs extra passes of share 0 on the step's first micro-batch (the same graph, so the same gradient
  hooks fire, and zero gradient). DeepSpeed clips (gradient_clipping = max_grad_norm) and steps.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from dalle_lab.training.deepspeed_engine import DeepSpeedEngine, build_deepspeed_config
from dalle_lab.training.precision import Precision


def chunks(items, size: int):
    """Consecutive slices of a list or tensor, `size` at a time."""
    for start in range(0, len(items), size):
        yield items[start:start + size]


class ClosureModule(torch.nn.Module):
    """What DeepSpeed's engine wraps: the policy, with a forward that runs the loss function it is given, so a loss of
    any shape (several passes, a reward model, the KL to a frozen reference) enters through the engine's forward.
    Why not call the policy directly: the engine's forward does per-micro-batch bookkeeping that its backward relies
    on (it clears ZeRO-1's separate gradient accumulator, kept for bf16/fp16 weights, at the start of each step, and
    arms the backward prologue). In float32 at ZeRO 0-2, the only setting alignment builds, bypassing it was measured
    to change nothing, so no test here can tell the two apart: this follows the API, it fixes no measured error."""

    def __init__(self, policy):
        super().__init__()
        self.policy = policy

    def forward(self, loss_fn):
        return loss_fn()


class Updates:
    """Optimizer steps for an AlignTrainer: `step(index, loss_of)` for a step of samples, `single(loss)` for one loss
    computed by the caller (best-of-n: one process, one micro-batch per step)."""

    def __init__(self, policy, trainable: list, optimizer, config, processes):
        self.trainable = trainable
        self.optimizer = optimizer
        self.config = config
        self.processes = processes
        self.deepspeed = self._make_deepspeed(policy) if config.deepspeed_zero_stage is not None else None

    def _make_deepspeed(self, policy):
        cfg, processes = self.config, self.processes
        precision = Precision(processes.device.type, None)  # float32: the RL losses take no autocast
        ds_config = build_deepspeed_config({}, batch_size=cfg.train_batch_size,
                                           ga_steps=cfg.gradient_accumulation_steps, world_size=processes.world_size,
                                           clip_grad_norm=cfg.max_grad_norm, precision=precision,
                                           zero_stage=cfg.deepspeed_zero_stage)
        # ZeRO asks before partitioning an optimizer it does not know (torch's SGD): both of ours update each
        # element from its own gradient and state, so a partition steps exactly as the whole would (tests check it)
        ds_config.setdefault("zero_allow_untested_optimizer", True)
        return DeepSpeedEngine(ClosureModule(policy), self.optimizer, precision, processes.info, ds_config)

    def micro_batches(self, index) -> tuple[list, list]:
        """(every micro-batch of the step, this process's share of them)."""
        micro = list(chunks(index, self.config.train_batch_size))
        return micro, self.processes.my_share(micro)

    def step(self, index, loss_of: Callable) -> tuple[float, list]:
        """One optimizer step over the samples `index`; loss_of(micro, share) -> (loss, result). Returns the gradient
        norm before clipping (the same in every process) and this process's results, in its micro-batches' order."""
        micro, mine = self.micro_batches(index)
        results = []
        if self.deepspeed is None:
            self.optimizer.zero_grad(set_to_none=True)
            for part in mine:
                loss, result = loss_of(part, len(part) / len(index))
                loss.backward()
                results.append(result)
            return self._plain_step(), results
        engine = self.deepspeed.engine
        passes = math.ceil(len(micro) / self.processes.world_size)  # the most any process has (ZeRO-2: all the same)
        for i in range(passes):
            real = i < len(mine)
            part, share = (mine[i], len(mine[i]) / len(index)) if real else (micro[0], 0.0)
            engine.set_gradient_accumulation_boundary(i == passes - 1)
            box = []

            def loss_fn(part=part, share=share, box=box):
                loss, result = loss_of(part, share)
                box.append(result)
                return loss

            self._deepspeed_backward(engine(loss_fn))
            if real:
                results.append(box[0])
        return self._deepspeed_step(), results

    def single(self, loss) -> float:
        """One step on one loss the caller computed (this process only, one micro-batch)."""
        if self.deepspeed is None:
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            return self._plain_step()
        self.deepspeed.engine.set_gradient_accumulation_boundary(True)
        self._deepspeed_backward(loss)
        return self._deepspeed_step()

    def _deepspeed_backward(self, loss) -> None:
        """DeepSpeed averages gradients over processes where we need their sum: scale by the number of processes.
        Our shares already divide the step, so no division by the accumulation steps (scale_wrt_gas=False). The
        product is also a new tensor, and that matters: the engine's forward hooks the tensor it returned with a
        division by gradient_accumulation_steps that engine.backward disarms only from a hook on the tensor it is
        given, and on the same tensor the forward's hook runs first (measured at ZeRO 0: gradients halved at 2
        accumulation steps)."""
        self.deepspeed.engine.backward(loss * self.processes.world_size, scale_wrt_gas=False)

    def _plain_step(self) -> float:
        self.processes.sum_gradients(self.trainable)
        norm = torch.nn.utils.clip_grad_norm_(self.trainable, self.config.max_grad_norm)
        self.optimizer.step()
        return float(norm)

    def _deepspeed_step(self) -> float:
        norm = None
        if self.deepspeed.zero_stage == 0:  # the reduced gradients are in .grad; DeepSpeed reports no norm at stage 0
            grads = [p.grad for p in self.trainable if p.grad is not None]
            norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
        self.deepspeed.engine.step()
        return norm if norm is not None else self.deepspeed.optimizer_step()[0]
