"""Training an image tokenizer: a taming VQModel (or GumbelVQ) trained with an offline loss, saved in taming's format.

The loss needs no downloaded weights: L1 + L2 reconstruction, the commitment term, codebook updates by EMA (or the
codebook loss with `codebook="grad"`), an optional PatchGAN discriminator (taming's NLayerDiscriminator, hinge
loss), and a perceptual term only when the user gives a TorchScript LPIPS module (`lpips_path`).

The pieces: train_config.py (the settings and the taming model config), train_data.py (the images, the held-out
part), train_step.py (one optimisation step), train_files.py (checkpoints, export); this module runs them and
measures the result (reconstruction quality on the held-out images, seconds per 1000 steps).

Files in `out_dir`:
    vqgan.yaml              the taming model config (load with VQGanVAE(ckpt, vqgan.yaml))
    last.ckpt               taming format + training state (optimizer, EMA codebook statistics, step): resume point
    vqgan.ckpt              the exported tokenizer: taming format, weights only (fp16 with export_half)
    samples/step_XXXXXX.png reconstructions (top rows: inputs, bottom rows: reconstructions)
    metrics.jsonl           one line per validation
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..image_grid import save_grid
from ..utils import open_wandb, pick_device
from . import taming_format
from .codebook import usage_stats
from .train_config import MODEL_FIELDS, VAETrainConfig, model_config
from .train_data import image_batches, stack_images, training_data
from .train_files import export_tokenizer, load_perceptual, save_state, start_or_resume
from .train_step import Float32GroupNorm, build_run, resolve_precision, train_step
from .vqgan import codebook_of, decode_latents, encode_to_indices

__all__ = ["MODEL_FIELDS", "Float32GroupNorm", "VAETrainConfig", "build_run", "evaluate_reconstructions",
           "export_tokenizer", "image_batches", "model_config", "summary", "train_step", "train_vae",
           "training_data"]


@torch.no_grad()
def evaluate_reconstructions(model, images: torch.Tensor, gumbel: bool, fmap_size: int,
                             batch_size: int = 128) -> tuple[dict[str, float], torch.Tensor]:
    """Encode to tokens and decode (the inference path); MSE/PSNR in [0, 1] and codebook usage. Returns recons."""
    was_training = model.training
    model.eval()
    codebook = codebook_of(model)
    recons, all_indices = [], []
    device = codebook.device
    for chunk in images.split(batch_size):
        indices = encode_to_indices(model, chunk.to(device), gumbel)
        all_indices.append(indices.flatten())
        recons.append(decode_latents(model, codebook[indices], fmap_size).cpu())
    model.train(was_training)
    recon = torch.cat(recons)
    mse = float(F.mse_loss(recon, images.cpu()))
    counts = torch.bincount(torch.cat(all_indices), minlength=codebook.shape[0])
    metrics = {"val_mse": mse, "val_psnr": 10 * math.log10(1 / max(mse, 1e-10))}
    metrics.update({f"val_{k}": v for k, v in usage_stats(counts).items()})
    return metrics, recon


def shapes_accuracy(recon: torch.Tensor, captions: list[str]) -> dict[str, float]:
    """The Shapes checker on reconstructions: does the tokenizer keep every attribute the captions state?"""
    from ..data.checker import evaluate

    result = evaluate(recon, captions)
    return {"checker_accuracy": result["accuracy"], "checker_exact": result["exact_match"]}


def train_vae(cfg: VAETrainConfig) -> dict[str, Any]:
    """Train (or resume) a tokenizer per `cfg`; returns the final validation metrics, the speed and the written
    paths (`summary(metrics)` says them in a few lines)."""
    from tqdm import tqdm

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = pick_device(cfg.device)
    train_source, val_items = training_data(cfg)  # before anything is written: a bad --data fails cleanly
    lpips = load_perceptual(cfg.lpips_path, device) if cfg.lpips_path else None  # and so does a bad --lpips_path
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    last = out / "last.ckpt"

    torch.manual_seed(cfg.seed)
    run = build_run(cfg, device)
    print(start_or_resume(run, cfg, out), file=sys.stderr)  # the first line: which run, from which step
    yaml_path = taming_format.write_config(model_config(cfg), out / "vqgan.yaml")  # once the run is known to match
    wandb_run = _open_wandb(cfg, run)
    amp_dtype = resolve_precision(cfg.precision, device)
    val_images = stack_images(val_items) if val_items else None
    val_captions = [caption for _, caption in val_items] if val_items else None
    batches = image_batches(train_source, cfg, run.step)

    def validate() -> dict[str, Any]:
        metrics: dict[str, Any] = {"step": run.step}
        if val_images is not None:
            scores, recon = evaluate_reconstructions(run.model, val_images, cfg.gumbel, cfg.fmap_size)
            metrics.update(scores)
            if cfg.data == "shapes":  # the checker costs ~3 ms per image: cheap enough for every validation
                metrics.update(shapes_accuracy(recon, val_captions))
        run.history.append(metrics)
        with open(out / "metrics.jsonl", "a") as handle:
            handle.write(json.dumps(metrics) + "\n")
        if wandb_run is not None:
            wandb_run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=run.step)
        return metrics

    def save_samples() -> None:
        images = val_images[:16] if val_images is not None else next(batches)[:16]
        _, recon = evaluate_reconstructions(run.model, images, cfg.gumbel, cfg.fmap_size)
        save_grid(torch.cat([images, recon]), out / "samples" / f"step_{run.step:06d}.png", nrow=8, scale=2)

    started, cpu_started, start_step, step_seconds = time.time(), time.process_time(), run.step, 0.0
    bar = tqdm(total=cfg.steps, initial=run.step, disable=not cfg.progress, desc="train_vae", dynamic_ncols=True)
    while run.step < cfg.steps:
        images = next(batches).to(device)
        step_start = time.perf_counter()
        logs = train_step(run, cfg, images, lpips, amp_dtype)
        step_seconds += time.perf_counter() - step_start
        run.step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{logs['loss']:.4f}", psnr=f"{logs['batch_psnr']:.1f}", codes=logs["batch_codes"],
                        refresh=False)
        if wandb_run is not None:
            wandb_run.log({f"train/{k}": v for k, v in logs.items()}, step=run.step)
        if cfg.val_every and run.step % cfg.val_every == 0 and run.step < cfg.steps:
            bar.write(f"step {run.step}: " + ", ".join(f"{k} {v:.4g}" for k, v in validate().items()
                                                         if isinstance(v, float)))
        if cfg.sample_every and run.step % cfg.sample_every == 0:
            save_samples()
        if cfg.save_every and run.step % cfg.save_every == 0:
            save_state(run, cfg, last)
    bar.close()

    metrics = validate()
    steps_this_run = run.step - start_step
    metrics.update(train_seconds=time.time() - started, train_cpu_seconds=time.process_time() - cpu_started,
                   steps_this_run=steps_this_run, val_images=0 if val_images is None else len(val_images),
                   seconds_per_1k_steps=1000 * step_seconds / steps_this_run if steps_this_run else None,
                   precision="bf16" if amp_dtype is not None else "fp32",
                   autocast=str(amp_dtype).replace("torch.", "") if amp_dtype else "float32",
                   threads=torch.get_num_threads(), image_size=cfg.image_size, fmap_size=cfg.fmap_size,
                   n_embed=cfg.n_embed, data=cfg.data)
    save_state(run, cfg, last)
    save_samples()
    ckpt_path, _ = export_tokenizer(cfg, last, out / "vqgan.ckpt", yaml_path)
    if wandb_run is not None:
        wandb_run.finish()
    metrics.update({"checkpoint": str(ckpt_path), "config": str(yaml_path), "last": str(last)})
    return metrics


def _open_wandb(cfg: VAETrainConfig, run):
    """The run's wandb run when --wandb_name asks for one (continuing a resumed run's), else None."""
    if not cfg.wandb_name:
        return None
    wandb_run = open_wandb(cfg.wandb_name, cfg.wandb_entity, cfg.wandb_project, run.wandb_run_id, config=asdict(cfg))
    run.wandb_run_id = getattr(wandb_run, "id", None)
    return wandb_run


def summary(metrics: dict[str, Any]) -> str:
    """What a finished run measured and wrote, and how to use it (train_vae.py prints this)."""
    held_out = ("no held-out images (give --val_data for shards)" if not metrics.get("val_images") else
                f"PSNR {metrics['val_psnr']:.1f} dB on {metrics['val_images']} held-out images of {metrics['data']} "
                f"(never trained on), {metrics['val_codes_used']} of {metrics['n_embed']} codes used")
    speed = ("no steps this run" if metrics.get("seconds_per_1k_steps") is None else
             f"{metrics['seconds_per_1k_steps']:.0f} s per 1000 steps ({metrics['steps_this_run']} steps this run, "
             f"{metrics['autocast']}, {metrics['threads']} threads)")
    grid = metrics["fmap_size"]
    return "\n".join([
        f"reconstruction: {held_out}",
        f"speed:          {speed}",
        f"tokenizer:      {metrics['checkpoint']} + {metrics['config']} ({metrics['image_size']} px -> {grid}x{grid} "
        f"grid of {metrics['n_embed']} codes)",
        f"use it:         python train_dalle.py ... --vqgan_model_path {metrics['checkpoint']} --vqgan_config_path "
        f"{metrics['config']}",
    ])
