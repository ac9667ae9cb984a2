"""A tokenizer training run's files: last.ckpt (taming format plus the training state: the resume point), the
exported tokenizer (weights only), and the user's perceptual-loss module."""
from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ..utils import atomic_torch_save
from . import taming_format
from .train_config import MODEL_FIELDS, VAETrainConfig, model_config
from .train_step import VAERun

def _state_dict_with_loss(run: VAERun) -> dict[str, torch.Tensor]:
    """Model weights plus, as in published checkpoints, the discriminator under `loss.discriminator.`"""
    state = dict(run.model.state_dict())
    if run.discriminator is not None:
        state.update({f"loss.discriminator.{k}": v for k, v in run.discriminator.state_dict().items()})
    return state


def save_state(run: VAERun, cfg: VAETrainConfig, path: Path) -> None:
    train_state = {"torch_rng": torch.get_rng_state(), "history": run.history, "wandb_run_id": run.wandb_run_id}
    if run.ema is not None:
        train_state["codebook"] = run.ema.state_dict()
    optimizers = [run.optimizer.state_dict()]
    if run.disc_optimizer is not None:
        optimizers.append(run.disc_optimizer.state_dict())
    atomic_torch_save({"state_dict": _state_dict_with_loss(run), "global_step": run.step,
                       "optimizer_states": optimizers, "train_state": train_state,
                       "train_config": asdict(cfg)}, path)


def resume_state(run: VAERun, cfg: VAETrainConfig, path: Path) -> None:
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    saved = checkpoint.get("train_config", {})
    def comparable(value):
        return tuple(value) if isinstance(value, (list, tuple)) else value

    different = [f"{k}: checkpoint {saved[k]!r} vs now {getattr(cfg, k)!r}" for k in MODEL_FIELDS
                 if k in saved and comparable(saved[k]) != comparable(getattr(cfg, k))]
    if different:
        raise ValueError(f"{path} was trained with other model settings ({'; '.join(different)}); "
                         "give another --output_dir, the same settings, or --overwrite to start afresh there")
    state = checkpoint["state_dict"]
    run.model.load_state_dict({k: v for k, v in state.items() if not k.startswith(taming_format.LOSS_PREFIX)})
    if run.discriminator is not None:
        prefix = "loss.discriminator."
        disc_state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if disc_state:
            run.discriminator.load_state_dict(disc_state)
    run.optimizer.load_state_dict(checkpoint["optimizer_states"][0])
    if run.disc_optimizer is not None and len(checkpoint["optimizer_states"]) > 1:
        run.disc_optimizer.load_state_dict(checkpoint["optimizer_states"][1])
    train_state = checkpoint.get("train_state", {})
    if run.ema is not None and "codebook" in train_state:
        run.ema.load_state_dict(train_state["codebook"])
    if "torch_rng" in train_state:
        torch.set_rng_state(train_state["torch_rng"])
    run.history = list(train_state.get("history", []))
    run.wandb_run_id = train_state.get("wandb_run_id")
    run.step = int(checkpoint["global_step"])


def start_or_resume(run: VAERun, cfg: VAETrainConfig, out: Path) -> str:
    """The resume rule (docs/training.md): the run `out` holds (last.ckpt) is continued - its model settings must
    match - unless cfg.resume is False (--overwrite), which deletes that run's state, metrics and sample grids
    first. Returns the run's first line, saying which."""
    last = out / "last.ckpt"
    if cfg.resume and last.is_file():
        resume_state(run, cfg, last)
        return f"resumed {last} at step {run.step} (the run {out} holds; --overwrite starts afresh)"
    stale = [last, out / "metrics.jsonl", *(out / "samples").glob("step_*.png")]
    removed = [path for path in stale if path.is_file()]
    for path in removed:
        path.unlink()
    return f"a new run in {out}" + (f" (--overwrite: {len(removed)} files of the run it held deleted)" if removed
                                    else "")


def export_tokenizer(cfg: VAETrainConfig, checkpoint_path: str | os.PathLike, ckpt_out: str | os.PathLike,
                     yaml_out: str | os.PathLike) -> tuple[Path, Path]:
    """Write a slim copy of a training checkpoint: weights only (fp16 with export_half) + the yaml."""
    state = torch.load(checkpoint_path, map_location="cpu", weights_only=True)["state_dict"]
    state = {k: (v.half() if cfg.export_half and v.is_floating_point() else v)
             for k, v in state.items() if not k.startswith(taming_format.LOSS_PREFIX)}
    taming_format.write_config(model_config(cfg), yaml_out)
    atomic_torch_save({"state_dict": state}, ckpt_out)
    return Path(ckpt_out), Path(yaml_out)


def load_perceptual(path: str | os.PathLike, device) -> Any:
    """A user-supplied perceptual distance `f(x, y) -> per-image distances`, images in [-1, 1], frozen.

    `.pt2`: a torch.export program (torch.export.save); anything else: a TorchScript file (torch.jit.save).
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"--lpips_path {path} does not exist (a torch.export .pt2 or TorchScript file)")
    if str(path).endswith(".pt2"):
        module = torch.export.load(str(path)).module().to(device)
    else:
        module = torch.jit.load(str(path), map_location=device).eval()
    for parameter in module.parameters():  # a frozen judge (ScriptModules have no requires_grad_)
        parameter.requires_grad_(False)
    return module
