"""What the training loop (loop.py) sets up before step 1 besides the tokenizers (tokenizer_choice.py) and the
data (sources.py): the device, the checkpoint to resume, the model config, the engine (plain or DeepSpeed) and the
run's summary line. Each function reads a TrainConfig and returns one piece; none of them trains.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from dalle_lab.data.builtin import MODEL_DEFAULTS
from dalle_lab.model import DALLEConfig
from dalle_lab.tokenizers import check_vocab_fits
from dalle_lab.utils import pick_device

from . import checkpoint as ckpt_io
from .config import TrainConfig
from .distributed import DistInfo, env_dist_info, init_process_group
from .engine import PlainEngine, make_optimizer
from .precision import resolve_precision
from .resume import changed_settings
from .sources import builtin_name

FLOPS_PROFILE_STEP = 200  # DALLE-pytorch's: late enough that start-up costs are out of the timings


def run_summary(cfg, model, precision, engine, dist, micro_batch, ga_steps, latest_path) -> str:
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


def run_device(cfg: TrainConfig, dist: DistInfo):
    device = pick_device(cfg.device)
    if device.type == "cuda" and dist.distributed:
        device = torch.device("cuda", dist.local_rank)
        torch.cuda.set_device(device)
    if not cfg.deepspeed:
        init_process_group(dist, device)
    return device


def dataset_model_defaults(cfg: TrainConfig) -> dict:
    """Model fields the built-in dataset brings (e.g. emoji's longer text context); none for the user's data."""
    return {} if cfg.image_text_folder else dict(MODEL_DEFAULTS[builtin_name(cfg)])


# Model fields that change how the weights train, not what they are: a run that starts from a checkpoint's weights
# takes them from the flags (DALLE-pytorch users change --loss_img_weight between runs); the rest come from it.
TRAINING_MODEL_FIELDS = ("loss_img_weight", "null_cond_prob", "attn_dropout", "ff_dropout")


def build_model_config(overrides: dict, tokenizer, vae, init_ckpt, dataset_defaults: dict,
                       resuming: bool = False) -> dict:
    """The model's config: a fresh one from the flags, or the checkpoint's (resumed: its every setting is checked
    against the flags later, check_resume_settings; started from its weights: with the training fields given)."""
    if init_ckpt:
        config = dict(init_ckpt["config"])  # a continued run keeps the model it was trained as
        config.update({name: overrides[name] for name in TRAINING_MODEL_FIELDS if name in overrides})
        if not resuming:
            _refuse_other_architecture(overrides, config)
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


def _refuse_other_architecture(overrides: dict, config: dict) -> None:
    """Model flags that ask for another network than the checkpoint's: its weights cannot start it, so say so
    instead of building the checkpoint's network and ignoring them."""
    from .resume import differing_model_fields

    differing = differing_model_fields(overrides, config, skip=TRAINING_MODEL_FIELDS)
    if differing:
        raise ckpt_io.CheckpointError(
            f"the checkpoint to start from is another network than these flags ask for: {'; '.join(differing)}. A run "
            "that starts from its weights keeps its architecture: leave those flags out (or train a new model "
            "without --dalle_path)")


def model_and_engine(cfg: TrainConfig, overrides: dict, tokenizers, init_ckpt, init_path, device, dist: DistInfo,
                     resuming: bool = False):
    """(model config, engine): the transformer built from its config (a continued run's from its checkpoint, with
    its weights), its optimizer and precision, in the plain or DeepSpeed engine."""
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    model_config = build_model_config(overrides, tokenizers.text, tokenizers.vae, init_ckpt,
                                      dataset_model_defaults(cfg), resuming)
    model = ckpt_io.build_model(model_config).to(device)
    model.transformer.gradient_checkpointing = cfg.gradient_checkpointing  # changes memory and time, not numbers
    if init_ckpt:
        ckpt_io.load_model_state(model, init_ckpt["model"], init_path)
    precision = resolve_precision(cfg.amp, device, cfg.amp_dtype)
    optimizer = make_optimizer(model, cfg.learning_rate, cfg.weight_decay)
    return model_config, make_engine(cfg, model, optimizer, precision, dist)


def resume_checkpoint(cfg: TrainConfig, model_overrides: dict):
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


def make_engine(cfg: TrainConfig, model, optimizer, precision, dist: DistInfo):
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
    return PlainEngine(model, optimizer, precision, dist, cfg.clip_grad_norm, cfg.ga_steps, cfg.batch_size)
