"""DeepSpeed as a training engine with the same methods as engine.PlainEngine.

- The user's --deepspeed_config is honoured: build_deepspeed_config only fills the keys it leaves out (batch sizes,
  accumulation, clipping, ZeRO stage, precision, optimizer).
- Mixed precision: on the CPU bf16 through DeepSpeed's `torch_autocast` (weights stay float32, the math is the
  plain path's autocast, and checkpoints need no down-cast weights); on CUDA `bf16`, or `fp16` with dynamic loss
  scaling where the GPU has no bf16. DeepSpeed refuses fp16 on the CPU.
- One-off compile costs are avoided: we pass our own torch optimizer (or fill "torch_adam": true into a user's
  Adam/AdamW section), so no FusedAdam/CPUAdam is built, and on the CPU the shared-memory allreduce op is switched
  off (gloo does the few small allreduces a CPU run needs; set DALLE_LAB_DS_SHM=1 to let DeepSpeed build it).
- Checkpoints: each rank writes its own DeepSpeed engine files (ZeRO partitions, optimizer, loss scaler) into a
  directory beside the dalle_lab checkpoint file, which holds the float32 weights generate.py reads without
  DeepSpeed (deepspeed_files.py: layout and durability; deepspeed_weights.py: which float32 weights). Only DeepSpeed
  resumes unpickle the engine files (DeepSpeed's own loader does not use weights_only): resume only from
  checkpoints you wrote.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from .errors import CheckpointError
from .deepspeed_files import (DS_TAG, check_checkpoint_engine, check_layout, engine_dir_of, engine_files_dir,
                              write_engine_files)
from .deepspeed_weights import float32_weights
from .distributed import DistInfo, set_single_process_env
from .precision import Precision

PRECISION_KEYS = ("fp16", "bf16", "torch_autocast", "amp")


def read_user_config(path) -> dict:
    if path is None:
        return {}
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"--deepspeed_config {path} does not exist") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"--deepspeed_config {path} is not valid JSON: {err}") from None


def build_deepspeed_config(user: dict, *, batch_size: int, ga_steps: int, world_size: int, clip_grad_norm: float,
                           precision: Precision, zero_stage: int | None = None,
                           flops_profile_step: int | None = None) -> dict:
    """The user's config with only the missing keys filled from our flags (the user's values always win).
    flops_profile_step: switch DeepSpeed's flops profiler on for that engine step (0 = the first), as
    DALLE-pytorch's --flops_profiler did (a detailed per-module report printed after that step)."""
    config = json.loads(json.dumps(user))  # deep copy: never modify the caller's dict
    micro = config.get("train_micro_batch_size_per_gpu")
    ga = config.get("gradient_accumulation_steps")
    total = config.get("train_batch_size")
    if micro is None and ga is None and total is None:
        micro, ga = batch_size, ga_steps
    elif micro is None and total is not None:
        ga = ga or 1
        micro = total // (ga * world_size)
    elif ga is None:
        ga = total // (micro * world_size) if total is not None else ga_steps
    config["train_micro_batch_size_per_gpu"] = micro
    config["gradient_accumulation_steps"] = ga
    config.setdefault("train_batch_size", micro * ga * world_size)
    if clip_grad_norm and clip_grad_norm > 0:
        config.setdefault("gradient_clipping", clip_grad_norm)
    zero = config.setdefault("zero_optimization", {})
    zero.setdefault("stage", 0 if zero_stage is None else zero_stage)
    if not any(key in config for key in PRECISION_KEYS) and precision.dtype is not None:
        if precision.device_type == "cpu":
            config["torch_autocast"] = {"enabled": True, "dtype": "bfloat16"}
        elif precision.dtype == "bf16":
            config["bf16"] = {"enabled": True}
        else:
            config["fp16"] = {"enabled": True, "loss_scale": 0}  # 0 = dynamic loss scaling
    optimizer = config.get("optimizer")
    if optimizer and str(optimizer.get("type", "")).lower() in ("adam", "adamw"):
        optimizer.setdefault("params", {}).setdefault("torch_adam", True)  # no FusedAdam/CPUAdam compile
    if flops_profile_step is not None:
        config.setdefault("flops_profiler", {"enabled": True, "profile_step": flops_profile_step, "module_depth": -1,
                                             "top_modules": 1, "detailed": True})
    config.setdefault("steps_per_print", 10**9)  # our own logger reports progress
    config.setdefault("wall_clock_breakdown", False)
    return config


def _avoid_shm_compile(device_type: str) -> None:
    if device_type != "cpu" or os.environ.get("DALLE_LAB_DS_SHM") == "1":
        return
    import deepspeed.ops

    # deepspeed/comm/torch.py builds the shared-memory allreduce op only when this table says it is compatible;
    # the table is cached in the module, so editing it before initialize() skips a 35-80 s compile.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


class DeepSpeedEngine:
    kind = "deepspeed"

    def __init__(self, model, optimizer, precision: Precision, dist: DistInfo, ds_config: dict):
        import deepspeed

        if not dist.distributed:
            set_single_process_env()
        _avoid_shm_compile(precision.device_type)
        self.module = model
        self.precision = precision
        self.dist = dist
        self.config = ds_config
        self.user_optimizer = "optimizer" in ds_config
        self.user_scheduler = "scheduler" in ds_config
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model,
            optimizer=None if self.user_optimizer else optimizer,
            model_parameters=[p for p in model.parameters() if p.requires_grad] if self.user_optimizer else None,
            config=ds_config,
        )
        self.base_optimizer = optimizer if not self.user_optimizer else self.optimizer
        self.ga_steps = self.engine.gradient_accumulation_steps()
        self.micro_batch_size = self.engine.train_micro_batch_size_per_gpu()
        self.zero_stage = self.engine.zero_optimization_stage()
        self.scaler = None
        check_checkpoint_engine(self.engine)

    @property
    def lr_optimizer(self):
        """None when the user's DeepSpeed config brings its own scheduler (then it is in charge of the rate)."""
        return None if self.user_scheduler else self.base_optimizer

    def train(self):
        self.engine.train()

    def forward(self, text, image_tokens):
        return self.engine(text, image_tokens, return_losses=True)

    def micro_batch(self, last_micro: bool):
        """DeepSpeed counts micro-batches and reduces at its own accumulation boundary."""
        import contextlib

        return contextlib.nullcontext()

    def backward(self, loss, last_micro: bool) -> None:
        # DeepSpeed divides by its accumulation steps itself and steps the optimizer on the boundary micro-batch
        self.engine.backward(loss)
        self.engine.step()

    def optimizer_step(self) -> tuple[float, bool]:
        norm = self.engine.get_global_grad_norm()
        norm = float(norm) if norm is not None else math.nan
        overflow = bool(getattr(self.engine.optimizer, "overflow", False))
        return norm, not overflow

    # -- checkpoint state (deepspeed_files.py: the layout on disk; deepspeed_weights.py: what "model" holds) -------
    def checkpoint_parts(self, checkpoint_path) -> dict | None:
        """Collective: every rank writes its own engine files into the directory beside `checkpoint_path`; rank 0
        gets {"model": float32 weights, "deepspeed": what the checkpoint records of the engine files}."""
        meta = self.save_engine_files(engine_dir_of(checkpoint_path))
        weights = float32_weights(self.engine, self.module, keep=self.dist.is_main)
        return {"model": weights, "deepspeed": meta} if self.dist.is_main else None

    def save_engine_files(self, directory) -> dict:
        """Collective: DeepSpeed's engine files, each rank its own, durably into `directory`; returns the record
        the checkpoint stores (its "dir" is relative to the checkpoint file's folder)."""
        return write_engine_files(self.engine, self.dist, Path(directory), self.zero_stage)

    def load_training_state(self, ckpt: dict, path="checkpoint") -> None:
        """Every rank hands DeepSpeed the checkpoint's engine directory; DeepSpeed reads that rank's partition."""
        meta = ckpt.get("deepspeed")
        if not meta:
            raise CheckpointError(f"{path} was written by a plain PyTorch run and holds no DeepSpeed engine state; "
                                  f"resume it without --deepspeed, or pass it as --dalle_path to start a new "
                                  f"DeepSpeed run from its weights")
        check_layout(meta, self.dist, self.zero_stage, path)
        with engine_files_dir(meta, path, self.dist.rank) as directory:
            load_path, _ = self.engine.load_checkpoint(str(directory), tag=meta.get("tag", DS_TAG),
                                                       load_optimizer_states=True,
                                                       load_lr_scheduler_states=self.user_scheduler)
        if load_path is None:
            raise CheckpointError(f"DeepSpeed could not load the engine state of {path} from {directory}")
