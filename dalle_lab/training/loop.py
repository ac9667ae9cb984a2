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
from .batches import FolderBatches, ShapesStream, WebDatasetBatches
from .config import TrainConfig
from .distributed import DistInfo, all_reduce_mean, any_rank, barrier, env_dist_info, gather_objects
from .precision import resolve_precision
from .schedule import LRSchedule
from .resume import changed_settings, check_resume_settings, run_facts
from .seeding import seed_micro_batch

SAMPLE_GRID_SIZE = 8
FLOPS_PROFILE_STEP = 200  # DALLE-pytorch's: late enough that start-up costs are out of the timings


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
    device = _device(cfg, dist)

    resume_path, resume_ckpt = _resume_checkpoint(cfg, model_overrides or {})
    init_ckpt = resume_ckpt or (ckpt_io.read_checkpoint(cfg.dalle_path) if cfg.dalle_path else None)
    if tokenizer is None:
        tokenizer = (ckpt_io.tokenizer_from_identity(init_ckpt["tokenizer"], cfg.dalle_path or resume_path)
                     if init_ckpt and cfg.bpe_path is None else _tokenizer(cfg))
    if vae is None:
        vae = (ckpt_io.vae_from_identity(init_ckpt["vae"], cfg.dalle_path or resume_path)
               if init_ckpt and cfg.vqgan_model_path is None else _vae(cfg))
    vae = vae.to(device).eval()
    _check_token_vae(cfg, vae)
    if init_ckpt:
        ckpt_io.check_identities(init_ckpt, tokenizer.identity, vae.identity, resume_path or cfg.dalle_path)

    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    model_config = _model_config(model_overrides or {}, tokenizer, vae, init_ckpt, _dataset_model_defaults(cfg))
    model = ckpt_io.build_model(model_config).to(device)
    model.transformer.gradient_checkpointing = cfg.gradient_checkpointing  # changes memory and time, not numbers
    if init_ckpt:
        ckpt_io.load_model_state(model, init_ckpt["model"], resume_path or cfg.dalle_path)

    from .engine import make_optimizer

    optimizer = make_optimizer(model, cfg.learning_rate, cfg.weight_decay)
    precision = resolve_precision(cfg.amp, device, cfg.amp_dtype)
    engine = _engine(cfg, model, optimizer, precision, dist)
    ga_steps, micro_batch = engine.ga_steps, engine.micro_batch_size

    source = _source(cfg, dist, micro_batch, vae.image_size, resume_ckpt["data_position"] if resume_ckpt else None,
                     tokenizer, model.config.text_seq_len)
    _check_budget(cfg, source)
    total_steps = _total_steps(cfg, source, ga_steps)
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
    logger.message(_summary(cfg, model, precision, engine, dist, micro_batch, ga_steps, latest_path))
    if resume_ckpt:
        logger.cut_metrics_back(step)
        logger.message(f"resumed {resume_path} at step {step}")
    sample_captions = _sample_captions(cfg)
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
    from .interrupt import StopRequests

    stop_requests = StopRequests(notify=logger.message)
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


# ------------------------------------------------------------------------------------------------ set-up helpers

def _summary(cfg, model, precision, engine, dist, micro_batch, ga_steps, latest_path) -> str:
    params = sum(p.numel() for p in model.parameters())
    data = cfg.image_text_folder or ("built-in Shapes (fresh batches)" if cfg.dataset == "shapes"
                                      else f"built-in {cfg.dataset}")
    if cfg.caption_noise:
        data += f", caption noise {cfg.caption_noise:g}"
    budget = ", ".join(f"{name} {value}" for name, value in (("max_steps", cfg.max_steps),
                                                              ("max_minutes", cfg.max_minutes),
                                                              ("epochs", cfg.epochs)) if value is not None)
    dtype = precision.dtype or "float32"
    if cfg.amp and precision.dtype is None:  # --amp asked for, but this CPU has no native bfloat16 (precision.py)
        dtype += " (no native bfloat16 on this CPU; --amp_dtype bf16 forces it, slowly)"
    return (f"DALLE {params / 1e6:.2f}M parameters | data: {data} | {engine.kind} on {precision.device_type}, "
            f"{dtype}, {dist.world_size} process(es) | batch {micro_batch} x {ga_steps} "
            f"x {dist.world_size} | {budget} | checkpoints: {latest_path}")


def _device(cfg: TrainConfig, dist: DistInfo):
    from dalle_lab.utils import pick_device

    device = pick_device(cfg.device)
    if device.type == "cuda" and dist.distributed:
        device = torch.device("cuda", dist.local_rank)
        torch.cuda.set_device(device)
    if not cfg.deepspeed:
        from .distributed import init_process_group

        init_process_group(dist, device)
    return device


def _tokenizer(cfg: TrainConfig):
    from dalle_lab.tokenizers import get_tokenizer

    return get_tokenizer(cfg.bpe_path, dataset=_builtin(cfg))


def _token_dir(cfg: TrainConfig) -> bool:
    """--image_text_folder names pre-tokenized data (a directory with the index pretokenize writes)."""
    from dalle_lab.data.tokens import is_token_dir

    return bool(cfg.image_text_folder) and not cfg.wds and is_token_dir(cfg.image_text_folder)


def _check_token_vae(cfg: TrainConfig, vae) -> None:
    """Pre-tokenized codes mean something only to the VQGAN that made them (it still decodes the sample grids)."""
    if _token_dir(cfg):
        from dalle_lab.data.tokens import check_vae, read_index

        check_vae(read_index(cfg.image_text_folder), vae.identity, cfg.image_text_folder)


def _vae(cfg: TrainConfig):
    if (cfg.vqgan_model_path is None) != (cfg.vqgan_config_path is None):
        raise ValueError("give both --vqgan_model_path (.ckpt) and --vqgan_config_path (.yaml), or neither for the "
                         f"default image tokenizer of --dataset {cfg.dataset}")
    if cfg.vqgan_model_path is None and _token_dir(cfg):  # the VQGAN the tokens were made with, as recorded
        from dalle_lab.data.tokens import read_index

        return ckpt_io.vae_from_identity(read_index(cfg.image_text_folder)["vae"], cfg.image_text_folder)
    if cfg.vqgan_model_path:
        from dalle_lab.vae import VQGanVAE

        return VQGanVAE(cfg.vqgan_model_path, cfg.vqgan_config_path)
    from dalle_lab.vae import default_vae

    return default_vae(dataset=_builtin(cfg))


def _dataset_model_defaults(cfg: TrainConfig) -> dict:
    """Model fields the built-in dataset brings (e.g. emoji's longer text context); none for the user's data."""
    from dalle_lab.data.builtin import MODEL_DEFAULTS

    return {} if cfg.image_text_folder else dict(MODEL_DEFAULTS[_builtin(cfg)])


def _model_config(overrides: dict, tokenizer, vae, init_ckpt, dataset_defaults: dict) -> dict:
    from dalle_lab.model import DALLEConfig
    from dalle_lab.tokenizers import check_vocab_fits

    if init_ckpt:
        config = dict(init_ckpt["config"])  # a continued run keeps the model it was trained as
    else:
        fields = {**dataset_defaults, **overrides}
        fields.setdefault("num_text_tokens", tokenizer.vocab_size)
        fields["num_image_tokens"], fields["image_fmap_size"] = vae.num_tokens, vae.fmap_size
        config = DALLEConfig(**fields).to_dict()
    check_vocab_fits(tokenizer, config["num_text_tokens"])
    if (config["num_image_tokens"], config["image_fmap_size"]) != (vae.num_tokens, vae.fmap_size):
        raise ckpt_io.CheckpointError(
            f"the model expects {config['num_image_tokens']} image tokens on a {config['image_fmap_size']}^2 grid, "
            f"the image tokenizer gives {vae.num_tokens} on {vae.fmap_size}^2")
    return config


def _resume_checkpoint(cfg: TrainConfig, model_overrides: dict):
    """(path, checkpoint) to continue exactly, or (None, None). --dalle_path of a training checkpoint resumes too,
    unless the settings differ from its run's: then a new run starts from its weights (--resume would refuse)."""
    path = resume_path(cfg)
    if path is None and cfg.dalle_path:
        candidate = ckpt_io.read_checkpoint(cfg.dalle_path)
        if not ckpt_io.is_training_checkpoint(candidate):
            return None, None
        changed = changed_settings(candidate, cfg, model_overrides, facts=None)
        if changed and env_dist_info().is_main:
            print(f"{cfg.dalle_path}: a new run starts from its weights, because these settings differ from its run: "
                  f"{'; '.join(changed)} (--resume continues it exactly instead)", file=sys.stderr)
        return (None, None) if changed else (cfg.dalle_path, candidate)
    if path is None:
        return None, None
    ckpt = ckpt_io.read_checkpoint(path)
    if not ckpt_io.is_training_checkpoint(ckpt):
        raise ckpt_io.CheckpointError(f"{path} holds weights only (no optimizer state, step, ...), so it cannot be "
                                      f"resumed exactly; pass it as --dalle_path to start a new run from it")
    return path, ckpt


def resume_path(cfg: TrainConfig) -> str | None:
    """The checkpoint --resume names (bare --resume: <output_dir>/<name>.pt), or None."""
    if cfg.resume == "latest":
        return str(Path(cfg.output_dir) / f"{cfg.dalle_output_file_name}.pt")
    return cfg.resume


def _engine(cfg: TrainConfig, model, optimizer, precision, dist: DistInfo):
    if cfg.flops_profiler and not cfg.deepspeed:
        raise ValueError("--flops_profiler is DeepSpeed's flops profiler: add --deepspeed (or --distributed_backend "
                         "deepspeed)")
    if cfg.deepspeed:
        from .deepspeed_engine import DeepSpeedEngine, build_deepspeed_config, read_user_config

        # profiled: the run's last step when it has a step budget (DALLE-pytorch profiled step 200, then exited)
        profile_step = (max(cfg.max_steps - 1, 0) if cfg.max_steps else FLOPS_PROFILE_STEP) if cfg.flops_profiler \
            else None
        ds_config = build_deepspeed_config(read_user_config(cfg.deepspeed_config), batch_size=cfg.batch_size,
                                           ga_steps=cfg.ga_steps, world_size=dist.world_size,
                                           clip_grad_norm=cfg.clip_grad_norm, precision=precision,
                                           zero_stage=cfg.zero_stage, flops_profile_step=profile_step)
        return DeepSpeedEngine(model, optimizer, precision, dist, ds_config)
    from .engine import PlainEngine

    return PlainEngine(model, optimizer, precision, dist, cfg.clip_grad_norm, cfg.ga_steps, cfg.batch_size)


def _builtin(cfg: TrainConfig) -> str:
    """The built-in dataset whose vocabulary and image tokenizer are the defaults (checked, even for user data)."""
    from dalle_lab.data.builtin import check_builtin

    return check_builtin(cfg.dataset)


def _source(cfg: TrainConfig, dist: DistInfo, batch_size: int, image_size: int, position: dict | None,
            tokenizer, text_seq_len: int):
    """The batches to train on; a folder's or the emoji data's captions are checked against text_seq_len here,
    before step 1 (shards: as they are read), see captions.py."""
    from .captions import LongCaptionCheck, check_dataset_captions, long_caption_mode

    mode = long_caption_mode(cfg.truncate_captions, cfg.skip_long_captions)

    def say(message: str) -> None:
        if dist.is_main:
            print(message, file=sys.stderr)

    if position and position.get("kind") != _source_kind(cfg):
        kinds = {"shapes": "the built-in Shapes stream", "folder": "an image-text folder or the built-in emoji data",
                 "webdataset": "WebDataset shards", "tokens": "pre-tokenized data"}
        raise ckpt_io.CheckpointError(
            f"the checkpoint was reading {kinds.get(position.get('kind'), position.get('kind'))}, this run reads "
            f"{kinds[_source_kind(cfg)]}: resume with the data flags of the original run "
            "(--dataset / --image_text_folder / --wds)")
    if cfg.random_resize_crop_lower_ratio != 1.0 and not (cfg.image_text_folder and not cfg.wds):
        raise ValueError(f"--random_resize_crop_lower_ratio {cfg.random_resize_crop_lower_ratio} applies to image-text "
                         "folders (--image_text_folder without --wds); the built-in data and shards are centre-cropped")
    if cfg.caption_noise and (cfg.image_text_folder or _builtin(cfg) != "shapes"):
        raise ValueError(f"--caption_noise {cfg.caption_noise} applies to the built-in shapes data only (it needs "
                         "the Shapes caption grammar), not to --dataset emoji, an --image_text_folder or --wds shards")
    if cfg.wds:
        # DALLE-pytorch's --wds names the image and caption members ("jpg,txt"); dalle_lab.data finds an image
        # member of any known extension and the txt member by itself, so the value only switches shards on.
        if not cfg.image_text_folder:
            raise ValueError("--wds reads WebDataset shards: give their path(s) or brace pattern as "
                             "--image_text_folder, e.g. --image_text_folder 'shards/data-{000..009}.tar' --wds jpg,txt")
        return WebDatasetBatches(cfg.image_text_folder, batch_size, image_size, cfg.seed, position, cfg.num_workers,
                                 long_captions=LongCaptionCheck(tokenizer, text_seq_len, mode), rank=dist.rank)
    if _token_dir(cfg):
        from dalle_lab.data.tokens import TokenShards

        dataset = check_dataset_captions(TokenShards(cfg.image_text_folder), tokenizer, text_seq_len, mode, say)
        return FolderBatches(dataset, batch_size, cfg.seed, dist.rank, dist.world_size, position, cfg.num_workers,
                             kind="tokens")
    if cfg.image_text_folder or _builtin(cfg) == "emoji":
        if cfg.image_text_folder:
            from dalle_lab.data import TextImageFolder

            dataset = TextImageFolder(cfg.image_text_folder, image_size=image_size,
                                      crop_lower_ratio=cfg.random_resize_crop_lower_ratio)
        else:
            from dalle_lab.data.builtin import builtin_dataset

            dataset = builtin_dataset("emoji", "train", image_size=image_size)
        dataset = check_dataset_captions(dataset, tokenizer, text_seq_len, mode, say)
        return FolderBatches(dataset, batch_size, cfg.seed, dist.rank, dist.world_size, position, cfg.num_workers)
    return ShapesStream(batch_size, image_size, cfg.seed, dist.rank, dist.world_size, position, cfg.caption_noise)


def _source_kind(cfg: TrainConfig) -> str:
    """What kind of position a source of these settings records (see batches.py)."""
    if cfg.wds:
        return "webdataset"
    if _token_dir(cfg):
        return "tokens"
    return "folder" if cfg.image_text_folder or cfg.dataset != "shapes" else "shapes"


def _total_steps(cfg: TrainConfig, source, ga_steps: int) -> int | None:
    """The LR decay horizon: max_steps, else epochs x steps per epoch when known (else: no decay)."""
    if cfg.max_steps:
        return cfg.max_steps
    per_epoch = getattr(source, "batches_per_epoch", None)
    if cfg.epochs and per_epoch:
        return cfg.epochs * per_epoch // max(1, ga_steps)  # the engine's: a DeepSpeed config may set its own
    return None


def _budget_exhausted(cfg: TrainConfig, step: int, source, run_start: float) -> str | None:
    if cfg.max_steps is not None and step >= cfg.max_steps:
        return "max_steps"
    if cfg.max_minutes is not None and time.monotonic() - run_start >= 60 * cfg.max_minutes:
        return "max_minutes"
    if cfg.epochs is not None and source.epoch >= cfg.epochs and not isinstance(source, ShapesStream):
        return "epochs"
    return None


def _check_budget(cfg: TrainConfig, source) -> None:
    if cfg.max_steps is None and cfg.max_minutes is None and (cfg.epochs is None or isinstance(source, ShapesStream)):
        raise ValueError("no end to training: give --max_steps or --max_minutes (the built-in Shapes data is an "
                         "endless stream, so --epochs does not apply to it)")


def _time_left(cfg: TrainConfig, step: int, run_start: float, steps_this_run: int) -> float | None:
    elapsed = time.monotonic() - run_start
    left = []
    if cfg.max_steps is not None and steps_this_run:
        left.append((cfg.max_steps - step) * elapsed / steps_this_run)
    if cfg.max_minutes is not None:
        left.append(60 * cfg.max_minutes - elapsed)
    return max(0.0, min(left)) if left else None


def _sample_captions(cfg: TrainConfig) -> list[str]:
    if cfg.sample_captions:
        return list(cfg.sample_captions)
    if cfg.image_text_folder:
        return []  # no known captions for a user's data: give --sample_captions to get grids
    from dalle_lab.data.builtin import builtin_captions

    return builtin_captions(_builtin(cfg), SAMPLE_GRID_SIZE)


# ------------------------------------------------------------------------------------------------ periodic work

def _write_samples(engine, dist, vae, tokenizer, captions, output_dir: Path, step: int, logger) -> None:
    """A grid of generated samples (rank 0; all ranks hold the full weights below ZeRO-3)."""
    if not dist.is_main or not captions or getattr(engine, "zero_stage", 0) >= 3:
        return
    from dalle_lab.viz.grid import save_grid

    from .generation import SamplingSettings, sample_images

    model = engine.module
    was_training = model.training
    model.eval()
    try:
        with engine.precision.autocast():
            images = sample_images(model, vae, tokenizer, captions, SamplingSettings(), seed=step)
    finally:
        model.train(was_training)
    path = save_grid(images, output_dir / "samples" / f"step{step:08d}.png", nrow=4, scale=3, captions=captions,
                     caption_height=12)
    logger.log_images(step, images, captions)
    logger.message(f"samples: {path}")


def _save(engine, dist, cfg, output_dir, latest_path, step, model_config, tokenizer, vae, schedule, source,
          nonfinite_total, wandb_run_id, facts) -> Path | None:
    """Collective: every rank contributes its RNG state (and DeepSpeed shard); rank 0 writes one file."""
    rng = gather_objects(ckpt_io.capture_rng())
    if engine.kind == "deepspeed":
        parts = engine.save_to_checkpoint(output_dir)
    else:
        parts = {"model": engine.model_state(), **engine.training_state()} if dist.is_main else None
    path = None
    if dist.is_main:
        checkpoint = ckpt_io.make_checkpoint(
            config=model_config, tokenizer_identity=tokenizer.identity, vae_identity=vae.identity, **parts,
            scheduler=schedule.state_dict(), step=step, epoch=source.epoch, data_position=source.position, rng=rng,
            train_config=_jsonable(cfg.to_dict()), run=facts, wandb_run_id=wandb_run_id,
            nonfinite_skipped=nonfinite_total, engine=engine.kind)
        step_path = ckpt_io.step_checkpoint_path(output_dir, cfg.dalle_output_file_name, step)
        ckpt_io.save_checkpoint(checkpoint, step_path)
        ckpt_io.link_latest(step_path, latest_path)
        ckpt_io.rotate_checkpoints(output_dir, cfg.dalle_output_file_name, cfg.keep_n_checkpoints)
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
