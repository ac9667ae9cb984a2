"""DeepSpeed as a training engine with the same methods as engine.PlainEngine.

- The user's --deepspeed_config is honoured: build_deepspeed_config only fills the keys it leaves out (batch sizes,
  accumulation, clipping, ZeRO stage, precision, optimizer).
- Mixed precision: on the CPU bf16 through DeepSpeed's `torch_autocast` (weights stay float32, the math is the
  plain path's autocast, and checkpoints need no down-cast weights); on CUDA `bf16`, or `fp16` with dynamic loss
  scaling where the GPU has no bf16. DeepSpeed refuses fp16 on the CPU.
- One-off compile costs are avoided: we pass our own torch optimizer (or fill "torch_adam": true into a user's
  Adam/AdamW section), so no FusedAdam/CPUAdam is built, and on the CPU the shared-memory allreduce op is switched
  off (gloo does the few small allreduces a CPU run needs; set DALLE_LAB_DS_SHM=1 to let DeepSpeed build it).
- Checkpoints: DeepSpeed writes its own engine files (ZeRO shards, optimizer partitions, loss scaler); we fold them,
  as raw bytes, into the one dalle_lab checkpoint file next to consolidated float32 weights, so there is still one
  atomic file and generate.py reads the weights without DeepSpeed. A resume unpacks the bytes to a private temp
  directory and lets DeepSpeed load them. Only DeepSpeed resumes unpickle those inner files (DeepSpeed's own loader
  does not use weights_only): resume only from checkpoints you wrote.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch

from .checkpoint import CheckpointError, model_state_without_vae
from .distributed import DistInfo, barrier, broadcast_object, set_single_process_env
from .precision import Precision

DS_TAG = "dalle_lab"
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

    @property
    def lr_optimizer(self):
        """None when the user's DeepSpeed config brings its own scheduler (then it is in charge of the rate)."""
        return None if self.user_scheduler else self.base_optimizer

    def train(self):
        self.engine.train()

    def forward(self, text, image_tokens):
        return self.engine(text, image_tokens, return_loss=True)

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

    # -- checkpoint state -------------------------------------------------------------------------------------
    def model_state(self, ds_dir=None) -> dict:
        """float32 weights for the checkpoint. Where the module itself is float32 (CPU autocast, fp32 runs) they
        are its parameters. Under DeepSpeed bf16/fp16 (CUDA) the module holds rounded copies and the float32
        master weights live in the optimizer's partitions: ZeRO 1-3 consolidate those from the saved engine files;
        ZeRO 0 has no such files, so its weights are the bf16/fp16 module's, widened (docs/training.md)."""
        low_precision = any(p.dtype != torch.float32 for p in self.module.parameters())
        if self.zero_stage < 3 and not (low_precision and self.zero_stage > 0 and ds_dir is not None):
            return {k: v.detach().float().cpu() for k, v in model_state_without_vae(self.module).items()}
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        if ds_dir is None:
            raise ValueError("ZeRO-3 weights are consolidated from a saved DeepSpeed checkpoint directory")
        state = get_fp32_state_dict_from_zero_checkpoint(ds_dir, tag=DS_TAG)
        return {k: v.float() for k, v in state.items() if not k.startswith("vae.")}

    def save_to_checkpoint(self, output_dir) -> dict | None:
        """Collective: every rank writes its shard; rank 0 returns {"model", "deepspeed"} for the checkpoint."""
        workdir = None
        if self.dist.is_main:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            workdir = tempfile.mkdtemp(prefix=".deepspeed-", dir=output_dir)
        workdir = broadcast_object(workdir)  # one shared directory (same file system for every rank)
        self.engine.save_checkpoint(workdir, tag=DS_TAG, client_state={}, save_latest=False)
        barrier()
        result = None
        if self.dist.is_main:
            files = {}
            for file in sorted(Path(workdir).rglob("*")):
                if file.is_file():
                    data = file.read_bytes()
                    files[str(file.relative_to(workdir))] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            result = {
                "model": self.model_state(workdir),
                "deepspeed": {"files": files, "world_size": self.dist.world_size, "zero_stage": self.zero_stage},
            }
        barrier()
        if self.dist.is_main:
            shutil.rmtree(workdir, ignore_errors=True)
        return result

    def load_training_state(self, ckpt: dict, path="checkpoint") -> None:
        packed = ckpt.get("deepspeed")
        if not packed:
            raise CheckpointError(f"{path} was written by a plain PyTorch run and holds no DeepSpeed engine state; "
                                  f"resume it without --deepspeed, or pass it as --dalle_path to start a new "
                                  f"DeepSpeed run from its weights")
        if packed["world_size"] != self.dist.world_size or packed["zero_stage"] != self.zero_stage:
            raise CheckpointError(
                f"{path} was written by {packed['world_size']} process(es) at ZeRO stage {packed['zero_stage']}; "
                f"this run has {self.dist.world_size} at stage {self.zero_stage}. Resume with the same layout, or "
                f"start a new run from its weights with --dalle_path")
        workdir = tempfile.mkdtemp(prefix=f".deepspeed-load-rank{self.dist.rank}-")
        try:
            for name, data in packed["files"].items():
                target = Path(workdir) / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data.numpy().tobytes())
            load_path, _ = self.engine.load_checkpoint(workdir, tag=DS_TAG, load_optimizer_states=True,
                                                       load_lr_scheduler_states=self.user_scheduler)
            if load_path is None:
                raise CheckpointError(f"DeepSpeed could not load the engine state stored in {path}")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
