"""Everything the training loop (loop.py) sets up before step 1, from the flags: the device, the text and image
tokenizers, the model config, the checkpoint to resume, the engine (plain or DeepSpeed), the data source with its
captions checked, and the LR horizon. Each function reads a TrainConfig and returns one piece; none of them trains.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from . import checkpoint as ckpt_io
from .batches import FolderBatches, ShapesStream, WebDatasetBatches
from .config import TrainConfig
from .distributed import DistInfo, env_dist_info
from .resume import changed_settings

SAMPLE_GRID_SIZE = 8
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
    from dalle_lab.utils import pick_device

    device = pick_device(cfg.device)
    if device.type == "cuda" and dist.distributed:
        device = torch.device("cuda", dist.local_rank)
        torch.cuda.set_device(device)
    if not cfg.deepspeed:
        from .distributed import init_process_group

        init_process_group(dist, device)
    return device


def tokenizer_from_flags(cfg: TrainConfig):
    from dalle_lab.tokenizers import get_tokenizer

    return get_tokenizer(cfg.bpe_path, dataset=builtin_name(cfg))


def _token_dir(cfg: TrainConfig) -> bool:
    """--image_text_folder names pre-tokenized data (a directory with the index pretokenize writes)."""
    from dalle_lab.data.tokens import is_token_dir

    return bool(cfg.image_text_folder) and not cfg.wds and is_token_dir(cfg.image_text_folder)


def check_token_vae(cfg: TrainConfig, vae) -> None:
    """Pre-tokenized codes mean something only to the VQGAN that made them (it still decodes the sample grids)."""
    if _token_dir(cfg):
        from dalle_lab.data.tokens import check_vae, read_index

        check_vae(read_index(cfg.image_text_folder), vae.identity, cfg.image_text_folder)


def vae_from_flags(cfg: TrainConfig):
    if (cfg.vqgan_model_path is None) != (cfg.vqgan_config_path is None):
        raise ValueError("give both --vqgan_model_path (.ckpt) and --vqgan_config_path (.yaml), or neither for the "
                         f"default image tokenizer of --dataset {cfg.dataset}")
    if cfg.vqgan_model_path is None and _token_dir(cfg):  # the VQGAN the tokens were made with, as recorded
        from dalle_lab.data.tokens import read_index

        return ckpt_io.vae_from_identity(read_index(cfg.image_text_folder)["vae"], cfg.image_text_folder)
    if cfg.vqgan_model_path:
        from dalle_lab.vae import VQGanVAE

        return VQGanVAE(cfg.vqgan_model_path, cfg.vqgan_config_path)
    if cfg.discrete_vae_path:
        from dalle_lab.vae import load_discrete_vae

        return load_discrete_vae(cfg.discrete_vae_path)
    from dalle_lab.vae import default_vae

    return default_vae(dataset=builtin_name(cfg))


def dataset_model_defaults(cfg: TrainConfig) -> dict:
    """Model fields the built-in dataset brings (e.g. emoji's longer text context); none for the user's data."""
    from dalle_lab.data.builtin import MODEL_DEFAULTS

    return {} if cfg.image_text_folder else dict(MODEL_DEFAULTS[builtin_name(cfg)])


def build_model_config(overrides: dict, tokenizer, vae, init_ckpt, dataset_defaults: dict) -> dict:
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
    from .engine import PlainEngine

    return PlainEngine(model, optimizer, precision, dist, cfg.clip_grad_norm, cfg.ga_steps, cfg.batch_size)


def builtin_name(cfg: TrainConfig) -> str:
    """The built-in dataset whose vocabulary and image tokenizer are the defaults (checked, even for user data)."""
    from dalle_lab.data.builtin import check_builtin

    return check_builtin(cfg.dataset)


def make_source(cfg: TrainConfig, dist: DistInfo, batch_size: int, image_size: int, position: dict | None,
                tokenizer, text_seq_len: int):
    """The batches to train on; a folder's, the emoji data's and every caption of the Shapes grammar are checked
    against text_seq_len here, before step 1 (shards: as they are read), see captions.py."""
    from .captions import LongCaptionCheck, check_caption_set, check_dataset_captions, long_caption_mode

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
    if cfg.caption_noise and (cfg.image_text_folder or builtin_name(cfg) != "shapes"):
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
    if cfg.image_text_folder or builtin_name(cfg) == "emoji":
        if cfg.image_text_folder:
            from dalle_lab.data import TextImageFolder

            dataset = TextImageFolder(cfg.image_text_folder, image_size=image_size,
                                      crop_lower_ratio=cfg.random_resize_crop_lower_ratio)
        else:
            from dalle_lab.data.builtin import builtin_dataset

            dataset = builtin_dataset("emoji", "train", image_size=image_size)
        dataset = check_dataset_captions(dataset, tokenizer, text_seq_len, mode, say)
        return FolderBatches(dataset, batch_size, cfg.seed, dist.rank, dist.world_size, position, cfg.num_workers)
    from dalle_lab.data.shapes import all_captions

    from .batches import SHAPES_SPLIT

    # caption noise swaps attributes within the same split, so these are all the captions the stream can produce
    check_caption_set(all_captions(SHAPES_SPLIT), tokenizer, text_seq_len, mode, "the built-in Shapes data")
    return ShapesStream(batch_size, image_size, cfg.seed, dist.rank, dist.world_size, position, cfg.caption_noise)


def _source_kind(cfg: TrainConfig) -> str:
    """What kind of position a source of these settings records (see batches.py)."""
    if cfg.wds:
        return "webdataset"
    if _token_dir(cfg):
        return "tokens"
    return "folder" if cfg.image_text_folder or cfg.dataset != "shapes" else "shapes"


def lr_horizon(cfg: TrainConfig, source, ga_steps: int) -> int | None:
    """The LR decay horizon: max_steps, else epochs x steps per epoch when known (else: no decay)."""
    if cfg.max_steps:
        return cfg.max_steps
    per_epoch = getattr(source, "batches_per_epoch", None)
    if cfg.epochs and per_epoch:
        return cfg.epochs * per_epoch // max(1, ga_steps)  # the engine's: a DeepSpeed config may set its own
    return None


def check_budget(cfg: TrainConfig, source) -> None:
    if cfg.max_steps is None and cfg.max_minutes is None and (cfg.epochs is None or isinstance(source, ShapesStream)):
        raise ValueError("no end to training: give --max_steps or --max_minutes (the built-in Shapes data is an "
                         "endless stream, so --epochs does not apply to it)")


def grid_captions(cfg: TrainConfig) -> list[str]:
    if cfg.sample_captions:
        return list(cfg.sample_captions)
    if cfg.image_text_folder:
        return []  # no known captions for a user's data: give --sample_captions to get grids
    from dalle_lab.data.builtin import builtin_captions

    return builtin_captions(builtin_name(cfg), SAMPLE_GRID_SIZE)
