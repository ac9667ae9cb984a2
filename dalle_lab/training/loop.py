"""The training loop: one function, `train(cfg)`, for the plain PyTorch path and DeepSpeed, one process or many.

A run has parts, each set up in one place: the tokenizers (tokenizer_choice.py), the data (sources.py), the model
and engine (run_setup.py), then the loop here. Per optimizer step: set the learning rate, run ga_steps
micro-batches (tokenize captions, encode images with the frozen VAE, forward, backward), clip and step; then log,
sample a grid and save a checkpoint at their intervals. A non-finite loss skips its micro-batch (counted); several
in a row stop the run with advice. Stop requests (Ctrl-C, SIGTERM) end the run at a step boundary, saved.
Everything a resume needs (weights, optimizer, schedule, scaler, step, data position, the wandb run id) goes into
the checkpoint, and every random draw is derived from (seed, rank, step, position) (seeding.py), so k steps +
resume + (N - k) steps equals N steps straight.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dalle_lab.image_grid import save_grid
from dalle_lab.seeding import seed_micro_batch
from . import checkpoint as ckpt_io
from . import run_setup as setup
from . import sources
from .batches import ShapesStream
from .config import TrainConfig
from .distributed import DistInfo, all_reduce_mean, any_rank, barrier, env_dist_info, gather_objects
from .errors import NonFiniteLossError
from .interrupt import StepHold, StopRequests
from .logging import RunLogger
from .resume import check_resume_settings, run_facts
from .schedule import LRSchedule
from .tokenizer_choice import RunTokenizers, choose_tokenizers


@dataclass
class TrainResult:
    step: int
    checkpoint_path: Path | None
    stopped_because: str
    nonfinite_skipped: int
    history: list[dict] = field(default_factory=list)  # per optimizer step: loss, loss_text, loss_img, lr, grad_norm


@dataclass
class _Run:
    """A run once set up, and where it has got to."""

    cfg: TrainConfig
    dist: DistInfo
    device: torch.device
    tokenizers: RunTokenizers
    model_config: dict
    engine: object
    source: object
    schedule: LRSchedule
    facts: dict
    logger: RunLogger
    latest_path: Path
    sample_captions: list[str]
    step: int = 0
    nonfinite_total: int = 0
    consecutive_nonfinite: int = 0
    last_saved: int = -1
    steps_this_run: int = 0
    history: list[dict] = field(default_factory=list)

    @property
    def model(self):
        return self.engine.module


def train(cfg: TrainConfig, model_overrides: dict | None = None, *, tokenizer=None, vae=None,
          stop_at_step: int | None = None) -> TrainResult:
    """Train a DALLE as `cfg` says. `model_overrides` are DALLEConfig fields (dim, depth, ...); the rest come from
    DALLEConfig's defaults, the tokenizer (num_text_tokens) and the VAE (num_image_tokens, image_fmap_size).
    `tokenizer` / `vae` objects may be given directly (tests, notebooks); otherwise tokenizer_choice.py finds them.
    When resuming, the model config, tokenizer and VAE recorded in the checkpoint are used.
    `stop_at_step` stops (and checkpoints) early without changing the LR schedule's horizon, as a killed run would:
    the resume tests use it.
    """
    run = _set_up(cfg, dict(model_overrides or {}), tokenizer, vae)
    with StopRequests(notify=run.logger.message) as stop_requests:
        try:
            stopped = _train_steps(run, stop_requests, stop_at_step)
            if run.step != run.last_saved:
                _save(run)
        except KeyboardInterrupt:
            # a second Ctrl-C (or one before the handler was set): mid-step state is not a consistent checkpoint,
            # so nothing is saved; the last checkpoint stays valid
            run.logger.message(f"stopped at once; the last checkpoint ({run.latest_path}, step {run.last_saved}) is "
                               "kept" if run.last_saved >= 0 else "stopped at once, before any checkpoint was written")
            run.logger.close()
            raise
    if stopped == "interrupted":
        run.logger.message(f"interrupted ({stop_requests.signal_name}): step {run.step} saved to {run.latest_path}; "
                           "continue with --resume")
    if cfg.sample_every_n_steps and run.step % cfg.sample_every_n_steps and run.steps_this_run:
        _write_samples(run)
    run.logger.message(f"stopped at step {run.step} ({stopped}); checkpoint: {run.latest_path}")
    run.logger.close()
    return TrainResult(run.step, run.latest_path if run.latest_path.exists() else None, stopped, run.nonfinite_total,
                       run.history)


# ------------------------------------------------------------------------------------------------ setting up

def _set_up(cfg: TrainConfig, overrides: dict, tokenizer, vae) -> _Run:
    """Every part of the run, in the order each needs the last: checkpoint, tokenizers, data, model, engine,
    batches, schedule, resumed state, logger. Nothing here trains."""
    sources.check_data_flags(cfg)
    dist = env_dist_info()
    device = setup.run_device(cfg, dist)
    resume_path, resume_ckpt = setup.resume_checkpoint(cfg, overrides)
    init_path = resume_path or cfg.dalle_path
    init_ckpt = resume_ckpt or (ckpt_io.read_checkpoint(cfg.dalle_path) if cfg.dalle_path else None)
    notes: list[str] = []  # what set-up finds, shown after the run's first line (an error shows alone)
    say = notes.append
    tokenizers = choose_tokenizers(cfg, init_ckpt, init_path, tokenizer=tokenizer, vae=vae, dist=dist,
                                   device=device)
    tokenizers.vae = tokenizers.vae.to(device).eval()
    dataset = sources.open_dataset(cfg, tokenizers.vae.image_size, say)
    overrides = sources.resolve_text_seq_len(cfg, overrides, init_ckpt, tokenizers.text, dataset, say)

    model_config, engine = setup.model_and_engine(cfg, overrides, tokenizers, init_ckpt, init_path, device, dist,
                                                  resuming=resume_ckpt is not None)
    model = engine.module
    source = sources.make_source(cfg, dist, engine.micro_batch_size, tokenizers.vae.image_size,
                                 resume_ckpt["data_position"] if resume_ckpt else None, tokenizers.text,
                                 model.config.text_seq_len, dataset, say)
    sources.check_budget(cfg, source)
    schedule = LRSchedule(cfg.learning_rate, cfg.warmup_steps, sources.lr_horizon(cfg, source, engine.ga_steps),
                          cfg.lr_decay, cfg.min_lr_ratio, cfg.plateau_factor, cfg.plateau_patience)
    facts = run_facts(world_size=dist.world_size, micro_batch=engine.micro_batch_size, ga_steps=engine.ga_steps,
                      schedule=schedule)
    if resume_ckpt:  # refused before anything is logged, in one line naming every changed setting
        check_resume_settings(resume_ckpt, cfg, overrides, facts, resume_path)
    logger = RunLogger(dist.is_main, cfg.progress, cfg.wandb_name, cfg.wandb_entity, cfg.wandb_project,
                       resume_ckpt.get("wandb_run_id") if resume_ckpt else None,
                       config={**cfg.to_dict(), "model": model_config},
                       metrics_path=Path(cfg.output_dir) / f"{cfg.dalle_output_file_name}-metrics.jsonl")
    latest_path = Path(cfg.output_dir) / f"{cfg.dalle_output_file_name}.pt"
    run = _Run(cfg, dist, device, tokenizers, model_config, engine, source, schedule, facts, logger, latest_path,
               sources.grid_captions(cfg))
    logger.message(tokenizers.describe())  # the run's first line: which vocabulary and image tokenizer, and why
    for note in notes:
        logger.message(note)
    logger.message(setup.run_summary(cfg, model, engine.precision, engine, dist, engine.micro_batch_size,
                                     engine.ga_steps, latest_path))
    if resume_ckpt:
        _restore(run, resume_ckpt, resume_path)
    return run


def _restore(run: _Run, ckpt: dict, path) -> None:
    """Continue where the checkpoint stopped (its settings were checked in _set_up). No RNG state to reload: every
    draw is re-derived from (seed, rank, step, ...), see seeding.py."""
    run.engine.load_training_state(ckpt, path)
    run.schedule.load_state_dict(ckpt["scheduler"])
    run.step = run.last_saved = int(ckpt["step"])
    run.nonfinite_total = int(ckpt.get("nonfinite_skipped", 0))
    run.logger.cut_metrics_back(run.step)
    run.logger.message(f"resumed {path} at step {run.step}")


# ------------------------------------------------------------------------------------------------ the loop

def _train_steps(run: _Run, stop_requests: StopRequests, stop_at_step: int | None) -> str:
    """Optimizer steps until the budget, `stop_at_step` or a stop request ends the run; returns why it ended."""
    cfg = run.cfg
    run.engine.train()
    run.logger.start(run.step, cfg.max_steps)
    hold = StepHold.from_environment(Path(cfg.output_dir), run.dist.rank)  # a test hook: inert unless its variable is set
    run_start = time.monotonic()
    samples_per_step = run.engine.micro_batch_size * run.engine.ga_steps * run.dist.world_size
    tokens_per_sample = run.model.config.text_seq_len + run.model.config.image_seq_len
    while True:
        stopped = _budget_exhausted(cfg, run.step, run.source, run_start) or (
            "stop_at_step" if stop_at_step is not None and run.step >= stop_at_step else None)
        # every rank takes part, so all of them stop at the same step boundary and save it together
        if any_rank(stop_requests.requested, run.device):
            stopped = "interrupted"
        if stopped:
            return stopped
        step_start = time.monotonic()
        metrics = _optimizer_step(run)
        run.step += 1
        run.steps_this_run += 1
        run.logger.advance()
        elapsed = time.monotonic() - step_start
        metrics.update(nonfinite_skipped=run.nonfinite_total, samples_per_s=samples_per_step / elapsed,
                       tokens_per_s=samples_per_step * tokens_per_sample / elapsed)
        run.history.append({"step": run.step, **metrics})
        if run.step % cfg.log_every_n_steps == 0 or run.step == 1:
            run.logger.log(run.step, metrics, _time_left(cfg, run.step, run_start, run.steps_this_run))
        if cfg.sample_every_n_steps and run.step % cfg.sample_every_n_steps == 0:
            _write_samples(run)
        if cfg.save_every_n_steps and run.step % cfg.save_every_n_steps == 0:
            _save(run)
        hold.after_step(run.step, stop_requests)


def _optimizer_step(run: _Run) -> dict:
    """ga_steps finite micro-batches (non-finite ones skipped and counted), then one optimizer step."""
    engine, model, cfg = run.engine, run.model, run.cfg
    lr = run.schedule.apply(engine.lr_optimizer) if engine.lr_optimizer is not None else math.nan
    sums = torch.zeros(3, dtype=torch.float64)
    done = attempt = 0
    while done < engine.ga_steps:
        captions, images = run.source.next_batch()
        # after the batch is fetched (starting a loader may draw from the global RNG): caption dropout and
        # dropout depend only on (seed, rank, step, attempt), see seeding.py
        seed_micro_batch(cfg.seed, run.dist.rank, run.step, attempt)
        attempt += 1
        text = run.tokenizers.text.tokenize(captions, model.config.text_seq_len,
                                            truncate_text=cfg.truncate_captions).to(run.device)
        if run.source.pretokenized:  # codes made once by pretokenize (the same VQGAN, checked at start)
            image_tokens = images.to(run.device)
        else:
            with torch.no_grad():
                image_tokens = run.tokenizers.vae.get_codebook_indices(images.to(run.device))
        last_micro = done + 1 == engine.ga_steps
        with engine.micro_batch(last_micro):  # DDP: no gradient all-reduce before the last micro-batch
            out = engine.forward(text, image_tokens)
            finite = not any_rank(not bool(torch.isfinite(out.loss.detach()).all()), run.device)
            if finite:
                engine.backward(out.loss, last_micro)
        if not finite:
            _count_nonfinite(run, done)
            continue
        run.consecutive_nonfinite = 0
        done += 1
        sums += torch.tensor([out.loss.item(), out.loss_text.item(), out.loss_img.item()], dtype=torch.float64)
    grad_norm, applied = engine.optimizer_step()
    loss, loss_text, loss_img = all_reduce_mean((sums / engine.ga_steps).tolist(), run.device)
    run.schedule.step(loss)
    return {"loss": loss, "loss_text": loss_text, "loss_img": loss_img, "lr": lr, "grad_norm": grad_norm,
            "step_applied": float(applied)}


def _count_nonfinite(run: _Run, done: int) -> None:
    run.nonfinite_total += 1
    run.consecutive_nonfinite += 1
    cfg, in_a_row = run.cfg, run.consecutive_nonfinite
    if in_a_row >= cfg.max_nonfinite:
        raise NonFiniteLossError(
            f"the loss was not finite {in_a_row} times in a row, last at step {run.step + 1} (micro-batch "
            f"{done + 1} of {run.engine.ga_steps}); training is diverging. Try --stable (CogView's PB-relax, "
            f"optionally with --sandwich_norm), a lower --learning_rate (now {cfg.learning_rate:g}), more "
            f"--warmup_steps, or a smaller --clip_grad_norm")
    run.logger.message(f"step {run.step + 1}: non-finite loss, micro-batch skipped ({in_a_row} in a row, "
                       f"{run.nonfinite_total} in all)")


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

def _write_samples(run: _Run) -> None:
    """A grid of generated samples (rank 0; all ranks hold the full weights below ZeRO-3)."""
    captions = run.sample_captions
    if not run.dist.is_main or not captions or getattr(run.engine, "zero_stage", 0) >= 3:
        return
    from dalle_lab.generate import GenerationConfig
    from dalle_lab.generate.folders import sample_images
    model, vae, step = run.model, run.tokenizers.vae, run.step
    was_training = model.training
    model.eval()
    try:
        with run.engine.precision.autocast():
            images = sample_images(model, vae, run.tokenizers.text, captions, GenerationConfig(), seed=step)
    finally:
        model.train(was_training)
    path = save_grid(images, Path(run.cfg.output_dir) / "samples" / f"step{step:08d}.png", nrow=4, scale=3,
                     captions=captions, caption_height=12)
    run.logger.log_images(step, images, captions)
    run.logger.message(f"samples: {path}")


def _save(run: _Run) -> None:
    """Collective: every rank contributes its RNG state (and, under DeepSpeed, writes its own engine files); rank 0
    writes the checkpoint file, then moves the latest link, then deletes what rotation drops (in that order, each
    durable before the next: a crash leaves the previous checkpoint whole)."""
    cfg, step = run.cfg, run.step
    rng = gather_objects(ckpt_io.capture_rng())
    output_dir = Path(cfg.output_dir)
    step_path = ckpt_io.step_checkpoint_path(output_dir, cfg.dalle_output_file_name, step)
    parts = run.engine.checkpoint_parts(step_path)
    if run.dist.is_main:
        checkpoint = ckpt_io.make_checkpoint(
            config=run.model_config, tokenizer_identity=run.tokenizers.text.identity,
            vae_identity=run.tokenizers.vae.identity, **parts, scheduler=run.schedule.state_dict(), step=step,
            epoch=run.source.epoch, data_position=run.source.position, rng=rng, train_config=_jsonable(cfg.to_dict()),
            run=run.facts, wandb_run_id=run.logger.wandb_run_id, nonfinite_skipped=run.nonfinite_total,
            engine=run.engine.kind)
        ckpt_io.save_checkpoint(checkpoint, step_path)
        ckpt_io.link_latest(step_path, run.latest_path)
        ckpt_io.rotate_checkpoints(output_dir, cfg.dalle_output_file_name, cfg.keep_n_checkpoints, step)
    barrier()
    run.last_saved = step


def _jsonable(value):
    """train_config as plain values (weights_only loading accepts dicts, lists, str, numbers, None)."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


__all__ = ["NonFiniteLossError", "TrainResult", "train"]
