"""The data a run trains on, from the flags: which dataset, its captions checked against the text context before
step 1 (captions.py), `--text_seq_len auto`, the batches (batches.py), the budget and the LR horizon that depend on
the data, and the captions of the sample grids.

    the built-in Shapes stream     no --image_text_folder, --dataset shapes (rendered fresh, endless)
    the built-in emoji data        --dataset emoji
    an image-text folder           --image_text_folder DIR
    pre-tokenized data             --image_text_folder DIR holding pretokenize's index.json
    WebDataset shards              --image_text_folder 'shards-{000..009}.tar' --wds jpg,txt
"""
from __future__ import annotations

from pathlib import Path

from dalle_lab.data.builtin import builtin_captions, builtin_dataset, check_builtin
from dalle_lab.data.folder import TextImageFolder
from dalle_lab.data.shapes import all_captions
from dalle_lab.data.tokens import TokenShards

from .batches import SHAPES_SPLIT, FolderBatches, ShapesStream, WebDatasetBatches
from .captions import LongCaptionCheck, auto_text_seq_len, check_caption_set, check_dataset_captions, long_caption_mode
from .config import TrainConfig
from .distributed import DistInfo
from .errors import CheckpointError
from .tokenizer_choice import AUTO, token_dir

SAMPLE_GRID_SIZE = 8
_KINDS = {"shapes": "the built-in Shapes stream", "folder": "an image-text folder or the built-in emoji data",
          "webdataset": "WebDataset shards", "tokens": "pre-tokenized data"}


def builtin_name(cfg: TrainConfig) -> str:
    """The built-in dataset whose vocabulary and image tokenizer are the defaults (checked, even for user data)."""
    return check_builtin(cfg.dataset)


def check_data_flags(cfg: TrainConfig) -> None:
    """Flags that apply to some data only, or out of range, refused in one line before anything is loaded."""
    long_caption_mode(cfg.truncate_captions, cfg.skip_long_captions)
    if not 0.0 <= cfg.caption_noise <= 1.0:
        raise ValueError(f"--caption_noise {cfg.caption_noise} must be a probability in [0, 1]")
    if cfg.random_resize_crop_lower_ratio != 1.0 and not (cfg.image_text_folder and not cfg.wds):
        raise ValueError(f"--random_resize_crop_lower_ratio {cfg.random_resize_crop_lower_ratio} applies to image-text "
                         "folders (--image_text_folder without --wds); the built-in data and shards are centre-cropped")
    if cfg.caption_noise and (cfg.image_text_folder or builtin_name(cfg) != "shapes"):
        raise ValueError(f"--caption_noise {cfg.caption_noise} applies to the built-in shapes data only (it needs "
                         "the Shapes caption grammar), not to --dataset emoji, an --image_text_folder or --wds shards")
    if cfg.wds and not cfg.image_text_folder:
        # DALLE-pytorch's --wds names the image and caption members ("jpg,txt"); dalle_lab.data finds an image
        # member of any known extension and the txt member by itself, so the value only switches shards on.
        raise ValueError("--wds reads WebDataset shards: give their path(s) or brace pattern as "
                         "--image_text_folder, e.g. --image_text_folder 'shards/data-{000..009}.tar' --wds jpg,txt")
    if cfg.image_text_folder and (cfg.vqgan_model_path is None) != (cfg.vqgan_config_path is None):
        # said here: the image tokenizer's own check would offer "neither", the built-in data's default, which
        # cannot draw a user's images
        given, missing = (("--vqgan_model_path", "--vqgan_config_path (.yaml)") if cfg.vqgan_model_path
                          else ("--vqgan_config_path", "--vqgan_model_path (.ckpt)"))
        raise ValueError(f"{given} needs {missing} too: give both (train_vae.py writes vqgan.ckpt and vqgan.yaml "
                         "side by side in its --output_dir)")
    if cfg.wds:  # every shard checked now, not by a loader worker once the model is built
        from dalle_lab.data.wds import expand_urls

        expand_urls(cfg.image_text_folder)
    elif cfg.image_text_folder and _names_shards(cfg.image_text_folder):
        raise ValueError(f"--image_text_folder {cfg.image_text_folder} names WebDataset shards, not a folder: add "
                         "--wds with the image and caption keys, e.g. --wds png,txt")


def _names_shards(path: str) -> bool:
    """A .tar file or a brace pattern of them: what --wds reads (a folder of .tar files without --wds stays a
    folder, so its own error says it holds no images)."""
    return path.endswith(".tar") and (Path(path).expanduser().is_file() or "{" in path)


def open_dataset(cfg: TrainConfig, image_size: int, say):
    """The map-style dataset of a folder, token directory or the emoji data, indexed (what a folder's index found
    is reported through `say`, see dalle_lab.data.folder); None for the streams (Shapes, shards)."""
    if cfg.wds:
        return None
    if token_dir(cfg):
        return TokenShards(cfg.image_text_folder)
    if cfg.image_text_folder:
        folder = TextImageFolder(cfg.image_text_folder, image_size=image_size,
                                 crop_lower_ratio=cfg.random_resize_crop_lower_ratio, warn=False)
        if folder.report.problems() or folder.report.converted:
            say(folder.report.summary())
        return folder
    if builtin_name(cfg) == "emoji":
        return builtin_dataset("emoji", "train", image_size=image_size)
    return None


def resolve_text_seq_len(cfg: TrainConfig, overrides: dict, init_ckpt: dict | None, tokenizer, dataset,
                         say) -> dict:
    """Model overrides with `--text_seq_len auto` replaced by the measured length (captions.auto_text_seq_len);
    a run continuing a checkpoint keeps the checkpoint's."""
    if overrides.get("text_seq_len") != AUTO:
        return overrides
    overrides = {k: v for k, v in overrides.items() if k != "text_seq_len"}
    if init_ckpt:
        return overrides
    mode = long_caption_mode(cfg.truncate_captions, cfg.skip_long_captions)
    return {**overrides, "text_seq_len": auto_text_seq_len(_caption_population(cfg, dataset), tokenizer, mode, say)}


def _caption_population(cfg: TrainConfig, dataset) -> list[tuple[str, str]]:
    """(where, caption) for every caption the data holds (finite data only)."""
    if cfg.wds:
        raise ValueError("--text_seq_len auto measures every caption before step 1, which shards (read as a stream) "
                         "do not allow: give a number (python -m dalle_lab.tokenizers.train --input captions.txt "
                         "... --text_seq_len N reports how many captions fit N)")
    if dataset is None:
        return [("the built-in Shapes data", caption) for caption in all_captions(SHAPES_SPLIT)]
    if hasattr(dataset, "numbered_caption_lines"):
        return [(f"{dataset.caption_source(i)}, line {n}", line) for i, n, line in dataset.numbered_caption_lines()]
    return [(f"{type(dataset).__name__} item {i}", caption) for i, caption in enumerate(dataset.captions())]


def make_source(cfg: TrainConfig, dist: DistInfo, batch_size: int, image_size: int, position: dict | None,
                tokenizer, text_seq_len: int, dataset, say):
    """The batches to train on; a folder's, the emoji data's and every caption of the Shapes grammar are checked
    against text_seq_len here, before step 1 (shards: as they are read), see captions.py."""
    mode = long_caption_mode(cfg.truncate_captions, cfg.skip_long_captions)
    kind = source_kind(cfg)
    if position and position.get("kind") != kind:
        raise CheckpointError(
            f"the checkpoint was reading {_KINDS.get(position.get('kind'), position.get('kind'))}, this run reads "
            f"{_KINDS[kind]}: resume with the data flags of the original run "
            "(--dataset / --image_text_folder / --wds)")
    if cfg.wds:
        return WebDatasetBatches(cfg.image_text_folder, batch_size, image_size, cfg.seed, position, cfg.num_workers,
                                 long_captions=LongCaptionCheck(tokenizer, text_seq_len, mode), rank=dist.rank)
    if dataset is not None:
        dataset = check_dataset_captions(dataset, tokenizer, text_seq_len, mode, say)
        return FolderBatches(dataset, batch_size, cfg.seed, dist.rank, dist.world_size, position, cfg.num_workers,
                             kind=kind)

    # caption noise swaps attributes within the same split, so these are all the captions the stream can produce
    check_caption_set(all_captions(SHAPES_SPLIT), tokenizer, text_seq_len, mode, "the built-in Shapes data")
    return ShapesStream(batch_size, image_size, cfg.seed, dist.rank, dist.world_size, position, cfg.caption_noise)


def source_kind(cfg: TrainConfig) -> str:
    """What kind of position a source of these settings records (see batches.py)."""
    if cfg.wds:
        return "webdataset"
    if token_dir(cfg):
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
    return builtin_captions(builtin_name(cfg), SAMPLE_GRID_SIZE)

