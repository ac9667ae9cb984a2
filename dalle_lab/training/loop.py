"""The training loop: one function, `train(cfg)`, for the plain PyTorch path and DeepSpeed, one process or many.

Per optimizer step: set the learning rate, run ga_steps micro-batches (tokenize captions, encode images with the
frozen VAE, forward, backward), clip and step; then log, sample a grid and save a checkpoint at their intervals.
A non-finite loss skips its micro-batch (counted); several in a row stop the run with advice.
Everything a resume needs (weights, optimizer, schedule, scaler, step, data position, the wandb run id) goes into
the checkpoint, and every random draw is derived from (seed, rank, step, position) (seeding.py), so k steps +
resume + (N - k) steps equals N steps straight.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import checkpoint as ckpt_io
from . import run_setup as setup
from .batches import ShapesStream
from .config import TrainConfig
from .distributed import all_reduce_mean, any_rank, barrier, env_dist_info, gather_objects
from .precision import resolve_precision
from .resume import check_resume_settings, run_facts
from .schedule import LRSchedule
from .seeding import seed_micro_batch


class NonFiniteLossError(RuntimeError):
    """Too many non-finite losses in a row: the run is diverging."""


@dataclass
class TrainResult:
    step: int
    checkpoint_path: Path | None
    stopped_because: str
    nonfinite_skipped: int
    history: list[dict] = field(default_factory=list)  # per optimizer step: loss, loss_text, loss_img, lr, grad_norm


def train(cfg: TrainConfig, model_overrides: dict | None = None, *, tokenizer=None, vae=None,
          stop_at_step: int | None = None) -> TrainResult:
    """Train a DALLE as `cfg` says. `model_overrides` are DALLEConfig fields (dim, depth, ...); the rest come from
    DALLEConfig's defaults, the tokenizer (num_text_tokens) and the VAE (num_image_tokens, image_fmap_size).
    `tokenizer` / `vae` objects may be given directly (tests, notebooks); otherwise they come from cfg's paths.
    When resuming, the model config, tokenizer and VAE recorded in the checkpoint are used.
    `stop_at_step` stops (and checkpoints) early without changing the LR schedule's horizon, as a killed run would:
    the resume tests use it.
    """
    dist = env_dist_info()
    device = setup.run_device(cfg, dist)

    resume_path, resume_ckpt = setup.resume_checkpoint(cfg, model_overrides or {})
    init_ckpt = resume_ckpt or (ckpt_io.read_checkpoint(cfg.dalle_path) if cfg.dalle_path else None)
    if tokenizer is None:
        tokenizer = (ckpt_io.tokenizer_from_identity(init_ckpt["tokenizer"], cfg.dalle_path or resume_path)
                     if init_ckpt and cfg.bpe_path is None else setup.tokenizer_from_flags(cfg))
    if vae is None:
        vae = (ckpt_io.vae_from_identity(init_ckpt["vae"], cfg.dalle_path or resume_path)
               if init_ckpt and cfg.vqgan_model_path is None else setup.vae_from_flags(cfg))
    vae = vae.to(device).eval()
    setup.check_token_vae(cfg, vae)
    if init_ckpt:
        ckpt_io.check_identities(init_ckpt, tokenizer.identity, vae.identity, resume_path or cfg.dalle_path)

    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    model_config = setup.build_model_config(model_overrides or {}, tokenizer, vae, init_ckpt,
                                            setup.dataset_model_defaults(cfg))
    model = ckpt_io.build_model(model_config).to(device)
    model.transformer.gradient_checkpointing = cfg.gradient_checkpointing  # changes memory and time, not numbers
    if init_ckpt:
        ckpt_io.load_model_state(model, init_ckpt["model"], resume_path or cfg.dalle_path)

    from .engine import make_optimizer

    optimizer = make_optimizer(model, cfg.learning_rate, cfg.weight_decay)
    precision = resolve_precision(cfg.amp, device, cfg.amp_dtype)
    engine = setup.make_engine(cfg, model, optimizer, precision, dist)
    ga_steps, micro_batch = engine.ga_steps, engine.micro_batch_size

    source = setup.make_source(cfg, dist, micro_batch, vae.image_size,
                               resume_ckpt["data_position"] if resume_ckpt else None, tokenizer,
                               model.config.text_seq_len)
    setup.check_budget(cfg, source)
    total_steps = setup.lr_horizon(cfg, source, ga_steps)
    schedule = LRSchedule(cfg.learning_rate, cfg.warmup_steps, total_steps, cfg.lr_decay, cfg.min_lr_ratio,
                          cfg.plateau_factor, cfg.plateau_patience)

    facts = run_facts(world_size=dist.world_size, micro_batch=micro_batch, ga_steps=ga_steps, schedule=schedule)
    step, nonfinite_total, wandb_run_id = 0, 0, None
    if resume_ckpt:
        check_resume_settings(resume_ckpt, cfg, model_overrides or {}, facts, resume_path)
        engine.load_training_state(resume_ckpt, resume_path)
        schedule.load_state_dict(resume_ckpt["scheduler"])
        step = int(resume_ckpt["step"])
        nonfinite_total = int(resume_ckpt.get("nonfinite_skipped", 0))
        wandb_run_id = resume_ckpt.get("wandb_run_id")
        # no RNG state to reload: every draw is re-derived from (seed, rank, step, ...), see seeding.py

    from .logging import RunLogger

    logger = RunLogger(dist.is_main, cfg.progress, cfg.wandb_name, cfg.wandb_entity, cfg.wandb_project, wandb_run_id,
                       config={**cfg.to_dict(), "model": model_config},
                       metrics_path=Path(cfg.output_dir) / f"{cfg.dalle_output_file_name}-metrics.jsonl")
    output_dir = Path(cfg.output_dir)
    latest_path = output_dir / f"{cfg.dalle_output_file_name}.pt"
    logger.message(setup.run_summary(cfg, model, precision, engine, dist, micro_batch, ga_steps, latest_path))
    if resume_ckpt:
        logger.cut_metrics_back(step)
        logger.message(f"resumed {resume_path} at step {step}")
    sample_captions = setup.grid_captions(cfg)
    tokens_per_sample = model.config.text_seq_len + model.config.image_seq_len
    samples_per_step = micro_batch * ga_steps * dist.world_size

    def save(at_step: int) -> Path:
        return _save(engine, dist, cfg, output_dir, latest_path, at_step, model_config, tokenizer, vae, schedule,
                     source, nonfinite_total, logger.wandb_run_id, facts)

    history: list[dict] = []
    consecutive_nonfinite, last_saved, saved_path = 0, step if resume_ckpt else -1, None
    stopped = "max_steps"
    engine.train()
    logger.start(step, cfg.max_steps)
    run_start, steps_this_run = time.monotonic(), 0
    from .interrupt import StepHold, StopRequests

    stop_requests = StopRequests(notify=logger.message)
    hold = StepHold.from_environment(output_dir, dist.rank)  # a test hook; does nothing unless its variable is set
    try:
        stop_requests.__enter__()
        while True:
            stopped = _budget_exhausted(cfg, step, source, run_start) or (
                "stop_at_step" if stop_at_step is not None and step >= stop_at_step else None)
            # every rank takes part, so all of them stop at the same step boundary and save it together
            if any_rank(stop_requests.requested, device):
                stopped = "interrupted"
            if stopped:
                break
            step_start = time.monotonic()
            lr = schedule.apply(engine.lr_optimizer) if engine.lr_optimizer is not None else math.nan
            sums = torch.zeros(3, dtype=torch.float64)
            done = attempt = 0
            while done < ga_steps:
                captions, images = source.next_batch()
                # after the batch is fetched (starting a loader may draw from the global RNG): caption dropout and
                # dropout depend only on (seed, rank, step, attempt), see seeding.py
                seed_micro_batch(cfg.seed, dist.rank, step, attempt)
                attempt += 1
                text = tokenizer.tokenize(captions, model.config.text_seq_len,
                                          truncate_text=cfg.truncate_captions).to(device)
                if source.pretokenized:  # codes made once by pretokenize (the same VQGAN, checked at start)
                    image_tokens = images.to(device)
                else:
                    with torch.no_grad():
                        image_tokens = vae.get_codebook_indices(images.to(device))
                last_micro = done + 1 == ga_steps
                with engine.micro_batch(last_micro):  # DDP: no gradient all-reduce before the last micro-batch
                    out = engine.forward(text, image_tokens)
                    finite = not any_rank(not bool(torch.isfinite(out.loss.detach()).all()), device)
                    if finite:
                        engine.backward(out.loss, last_micro)
                if not finite:
                    nonfinite_total += 1
                    consecutive_nonfinite += 1
                    if consecutive_nonfinite >= cfg.max_nonfinite:
                        raise NonFiniteLossError(
                            f"the loss was not finite {consecutive_nonfinite} times in a row, last at step {step + 1} "
                            f"(micro-batch {done + 1} of {ga_steps}); training is diverging. Try --stable (CogView's "
                            f"PB-relax, optionally with --sandwich_norm), a lower --learning_rate (now "
                            f"{cfg.learning_rate:g}), more --warmup_steps, or a smaller --clip_grad_norm")
                    logger.message(f"step {step + 1}: non-finite loss, micro-batch skipped "
                                   f"({consecutive_nonfinite} in a row, {nonfinite_total} in all)")
                    continue
                consecutive_nonfinite = 0
                done += 1
                sums += torch.tensor([out.loss.item(), out.loss_text.item(), out.loss_img.item()], dtype=torch.float64)
            grad_norm, applied = engine.optimizer_step()
            loss, loss_text, loss_img = all_reduce_mean((sums / ga_steps).tolist(), device)
            schedule.step(loss)
            step += 1
            steps_this_run += 1
            logger.advance()
            elapsed = time.monotonic() - step_start
            metrics = {"loss": loss, "loss_text": loss_text, "loss_img": loss_img, "lr": lr, "grad_norm": grad_norm,
                       "step_applied": float(applied), "nonfinite_skipped": nonfinite_total,
                       "samples_per_s": samples_per_step / elapsed,
                       "tokens_per_s": samples_per_step * tokens_per_sample / elapsed}
            history.append({"step": step, **metrics})
            if step % cfg.log_every_n_steps == 0 or step == 1:
                logger.log(step, metrics, _time_left(cfg, step, run_start, steps_this_run))
            if cfg.sample_every_n_steps and step % cfg.sample_every_n_steps == 0:
                _write_samples(engine, dist, vae, tokenizer, sample_captions, output_dir, step, logger)
            if cfg.save_every_n_steps and step % cfg.save_every_n_steps == 0:
                saved_path = save(step)
                last_saved = step
            hold.after_step(step, stop_requests)
        if step != last_saved:
            saved_path = save(step)
            last_saved = step
    except KeyboardInterrupt:
        # a second Ctrl-C (or one before the handler was set): mid-step state is not a consistent checkpoint,
        # so nothing is saved; the last checkpoint stays valid
        logger.message(f"stopped at once; the last checkpoint ({latest_path}, step {last_saved}) is kept"
                       if last_saved >= 0 else "stopped at once, before any checkpoint was written")
        logger.close()
        raise
    finally:
        stop_requests.__exit__(None, None, None)
    if stopped == "interrupted":
        logger.message(f"interrupted ({stop_requests.signal_name}): step {step} saved to {latest_path}; "
                       "continue with --resume")
    if cfg.sample_every_n_steps and step % cfg.sample_every_n_steps and steps_this_run:
        _write_samples(engine, dist, vae, tokenizer, sample_captions, output_dir, step, logger)
    logger.message(f"stopped at step {step} ({stopped}); checkpoint: {latest_path}")
    logger.close()
    return TrainResult(step, latest_path if (saved_path or latest_path.exists()) else None, stopped, nonfinite_total,
                       history)


# ------------------------------------------------------------------------------------------------ the budget

def _budget_exhausted(cfg: TrainConfig, step: int, source, run_start: float) -> str | None:
    if cfg.max_steps is not None and step >= cfg.max_steps:
        return "max_steps"
    if cfg.max_minutes is not None and time.monotonic() - run_start >= 60 * cfg.max_minutes:
        return "max_minutes"
    if cfg.epochs is not None and source.epoch >= cfg.epochs and not isinstance(source, ShapesStream):
        return "epochs"
    return None


def _time_left(cfg: TrainConfig, step: int, run_start: float, steps_this_run: int) -> float | None:
    elapsed = time.monotonic() - run_start
    left = []
    if cfg.max_steps is not None and steps_this_run:
        left.append((cfg.max_steps - step) * elapsed / steps_this_run)
    if cfg.max_minutes is not None:
        left.append(60 * cfg.max_minutes - elapsed)
    return max(0.0, min(left)) if left else None


# ------------------------------------------------------------------------------------------------ periodic work

def _write_samples(engine, dist, vae, tokenizer, captions, output_dir: Path, step: int, logger) -> None:
    """A grid of generated samples (rank 0; all ranks hold the full weights below ZeRO-3)."""
    if not dist.is_main or not captions or getattr(engine, "zero_stage", 0) >= 3:
        return
    from dalle_lab.viz.grid import save_grid

    from dalle_lab.generate import GenerationConfig
    from dalle_lab.generate.folders import sample_images

    model = engine.module
    was_training = model.training
    model.eval()
    try:
        with engine.precision.autocast():
            images = sample_images(model, vae, tokenizer, captions, GenerationConfig(), seed=step)
    finally:
        model.train(was_training)
    path = save_grid(images, output_dir / "samples" / f"step{step:08d}.png", nrow=4, scale=3, captions=captions,
                     caption_height=12)
    logger.log_images(step, images, captions)
    logger.message(f"samples: {path}")


def _save(engine, dist, cfg, output_dir, latest_path, step, model_config, tokenizer, vae, schedule, source,
          nonfinite_total, wandb_run_id, facts) -> Path | None:
    """Collective: every rank contributes its RNG state (and, under DeepSpeed, writes its own engine files); rank 0
    writes the checkpoint file, then moves the latest link, then deletes what rotation drops (in that order, each
    durable before the next: a crash leaves the previous checkpoint whole)."""
    rng = gather_objects(ckpt_io.capture_rng())
    step_path = ckpt_io.step_checkpoint_path(output_dir, cfg.dalle_output_file_name, step)
    parts = engine.checkpoint_parts(step_path)
    path = None
    if dist.is_main:
        checkpoint = ckpt_io.make_checkpoint(
            config=model_config, tokenizer_identity=tokenizer.identity, vae_identity=vae.identity, **parts,
            scheduler=schedule.state_dict(), step=step, epoch=source.epoch, data_position=source.position, rng=rng,
            train_config=_jsonable(cfg.to_dict()), run=facts, wandb_run_id=wandb_run_id,
            nonfinite_skipped=nonfinite_total, engine=engine.kind)
        ckpt_io.save_checkpoint(checkpoint, step_path)
        ckpt_io.link_latest(step_path, latest_path)
        ckpt_io.rotate_checkpoints(output_dir, cfg.dalle_output_file_name, cfg.keep_n_checkpoints, step)
        path = latest_path
    barrier()
    return path


def _jsonable(value):
    """train_config as plain values (weights_only loading accepts dicts, lists, str, numbers, None)."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


__all__ = ["NonFiniteLossError", "TrainResult", "train"]
