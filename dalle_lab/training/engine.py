"""The plain PyTorch training engine: forward under autocast, backward (DDP across processes), clipping, the
optimizer step with optional fp16 loss scaling, and its checkpoint state.

deepspeed_engine.DeepSpeedEngine has the same methods, so the loop in loop.py does not care which one it drives.
"""
from __future__ import annotations

import contextlib
import math

import torch

from .checkpoint import model_state_without_vae
from .distributed import DistInfo
from .errors import CheckpointError
from .precision import Precision


_FUSED_ADAMW_DEVICES = ("cpu", "cuda")


def adamw(params, **hyperparameters) -> torch.optim.AdamW:
    """torch.optim.AdamW with its fused kernel wherever every parameter allows it (floating point, on the CPU or a
    CUDA device). Why: it replaces the per-parameter loop over every weight tensor with one kernel, a small share of a
    step that grows for small models and batches (measured by lab/perf/optimizer_step.py, its results file in
    lab/perf/results/). Its updates agree with the loop's to float rounding, not
    bitwise; a checkpoint keeps the kernel it was saved with, so a resumed run continues exactly."""
    params = list(params)
    fusable = bool(params) and all(p.is_floating_point() and p.device.type in _FUSED_ADAMW_DEVICES for p in params)
    return torch.optim.AdamW(params, fused=fusable or None, **hyperparameters)


def make_optimizer(model, learning_rate: float, weight_decay: float = 0.0):
    """AdamW over the trainable parameters (a frozen VAE inside the model is skipped)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return adamw(params, lr=learning_rate, weight_decay=weight_decay, betas=(0.9, 0.96))


class PlainEngine:
    kind = "plain"

    def __init__(self, model, optimizer, precision: Precision, dist: DistInfo, clip_grad_norm: float = 0.0,
                 ga_steps: int = 1, micro_batch_size: int = 1):
        self.module = model
        self.optimizer = optimizer
        self.precision = precision
        self.clip_grad_norm = clip_grad_norm
        self.ga_steps = ga_steps
        self.micro_batch_size = micro_batch_size
        self.scaler = precision.grad_scaler()
        if dist.distributed:
            from torch.nn.parallel import DistributedDataParallel

            device_ids = [dist.local_rank] if precision.device_type == "cuda" else None
            self.model = DistributedDataParallel(model, device_ids=device_ids)
        else:
            self.model = model
        self._ddp = dist.distributed
        self._is_main = dist.is_main

    @property
    def lr_optimizer(self):
        """The optimizer whose param groups the LR schedule writes."""
        return self.optimizer

    def train(self):
        self.module.train()

    def forward(self, text, image_tokens):
        with self.precision.autocast():
            return self.model(text, image_tokens, return_losses=True)

    def micro_batch(self, last_micro: bool):
        """Context for one micro-batch's forward AND backward: DDP all-reduces gradients only on the last one.
        (no_sync must hold the forward too: DDP decides in the forward whether the coming backward reduces.)"""
        return contextlib.nullcontext() if (last_micro or not self._ddp) else self.model.no_sync()

    def backward(self, loss, last_micro: bool) -> None:
        """Accumulate gradients of one micro-batch (inside `micro_batch(last_micro)`)."""
        loss = loss / self.ga_steps
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def optimizer_step(self) -> tuple[float, bool]:
        """Clip and step. Returns (grad norm before clipping, whether the step was applied)."""
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        max_norm = self.clip_grad_norm if self.clip_grad_norm > 0 else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        applied = True
        if self.scaler:
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)  # skips the update itself when the fp16 gradients overflowed
            self.scaler.update()
            applied = self.scaler.get_scale() >= scale
        elif math.isfinite(norm):
            self.optimizer.step()
        else:
            applied = False  # finite loss, non-finite gradients: never let them into the weights
        self.optimizer.zero_grad(set_to_none=True)
        return norm, applied

    # -- checkpoint state -------------------------------------------------------------------------------------
    def checkpoint_parts(self, checkpoint_path=None) -> dict | None:
        """What rank 0 puts in the checkpoint: the float32 weights (autocast never rounds them), the optimizer
        and loss scaler. Every rank holds the same, so the others contribute nothing."""
        if not self._is_main:
            return None
        return {"model": model_state_without_vae(self.module), "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler else None}

    def load_training_state(self, ckpt: dict, path="checkpoint") -> None:
        if "optimizer" not in ckpt:
            raise CheckpointError(f"{path} holds no plain-PyTorch optimizer state (it was written by a DeepSpeed run);"
                                  f" resume it with --deepspeed, or pass it as --dalle_path to start a new run from "
                                  f"its weights")
        self.optimizer.load_state_dict(ckpt["optimizer"])
        if self.scaler and ckpt.get("scaler"):
            self.scaler.load_state_dict(ckpt["scaler"])
