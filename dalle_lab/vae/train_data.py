"""The images a tokenizer trains on: a built-in dataset, a folder of images (a seeded part held out for
validation) or WebDataset shards, as endless seeded batches that a resumed run continues exactly."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import torch

from ..data.builtin import BUILTIN_DATASETS, builtin_dataset
from .train_config import VAETrainConfig

def _is_shards(data: str) -> bool:
    return ".tar" in data


def training_data(cfg: VAETrainConfig):
    """(train source, validation images or None). The train source is a map-style dataset or shard pattern."""
    if cfg.data in BUILTIN_DATASETS:
        # Shapes is procedural: a practically endless train split, so every batch is fresh (emoji ignores length)
        train = builtin_dataset(cfg.data, "train", cfg.image_size, length=10**12, seed=cfg.seed)
        val = builtin_dataset(cfg.data, "val", cfg.image_size, length=cfg.val_size, seed=cfg.seed)
        val_items = [val[i] for i in range(min(cfg.val_size, len(val)))]
        return train, val_items
    if _is_shards(cfg.data):
        val_items = None
        if cfg.val_data:
            from ..data.wds import webdataset_dataset

            val_items = []
            for item in webdataset_dataset(cfg.val_data, image_size=cfg.image_size, rank=0, world_size=1):
                val_items.append(item)
                if len(val_items) >= cfg.val_size:
                    break
        return cfg.data, val_items
    if Path(cfg.data).expanduser().is_dir():
        return _folder_data(cfg)
    if "/" in cfg.data or Path(cfg.data).suffix:
        raise FileNotFoundError(f"--data {cfg.data}: no such folder (a folder of images; captions are not needed)")
    raise ValueError(f"--data {cfg.data!r} is neither a built-in dataset ({', '.join(BUILTIN_DATASETS)}), "
                     "an existing folder of images, nor WebDataset shards (a .tar path or brace pattern)")


def _folder_data(cfg: VAETrainConfig):
    """A folder of images: a seeded tenth (at most val_size images) held out for validation, the rest trained on.
    Every image counts, captioned or not (a tokenizer never reads captions); unreadable images are left out and
    counted (dalle_lab.data.folder.ImageFolder); the held-out images are decoded now."""
    from torch.utils.data import Subset

    from ..data.folder import ImageFolder

    folder = ImageFolder(cfg.data, image_size=cfg.image_size)
    order = torch.randperm(len(folder), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    n_val = min(cfg.val_size, len(folder) // 10) or 1  # hold out at most a tenth of a small folder
    loaded = [(folder.load(i), "") for i in order[:n_val]]  # None: it cannot be decoded
    val_items = [(image, caption) for image, caption in loaded if image is not None]
    if not val_items:
        raise ValueError(f"--data {cfg.data}: none of the {n_val} held-out images could be decoded "
                         f"({folder.report.brief()})")
    train = order[n_val:]
    if len(train) < 1:
        raise ValueError(f"--data {cfg.data}: {len(folder)} usable image(s), {n_val} held out for validation: "
                         "nothing left to train on (a tokenizer needs a few hundred images or more)")
    return Subset(folder, train), val_items


def stack_images(items) -> torch.Tensor:
    return torch.stack([image for image, _ in items])


def image_batches(source, cfg: VAETrainConfig, start_step: int) -> Iterator[torch.Tensor]:
    """Endless (B, 3, H, W) batches in [0, 1] for steps start_step, start_step + 1, ...

    Map-style data is read in a seeded order that depends only on the step, so a resumed run sees exactly the
    batches it would have seen; shards are re-read from the start on resume (webdataset has no random access).
    """
    if isinstance(source, str):  # WebDataset shards
        from ..data.wds import webdataset_loader

        epoch = 0
        while True:
            loader = webdataset_loader(source, batch_size=cfg.batch_size, image_size=cfg.image_size,
                                       shuffle=1000, seed=cfg.seed + epoch)
            for images, _ in loader:
                if images.shape[0] == cfg.batch_size:
                    yield images
            epoch += 1
    size = len(source)
    orders: dict[int, list[int]] = {}  # epoch -> its shuffled order (a batch spans at most two epochs)

    def position_to_index(position: int) -> int:
        epoch, offset = divmod(position, size)
        if epoch not in orders:
            for old_epoch in [e for e in orders if e < epoch - 1]:
                del orders[old_epoch]
            generator = torch.Generator().manual_seed(cfg.seed * 100_003 + epoch)
            orders[epoch] = torch.randperm(size, generator=generator).tolist()
        return orders[epoch][offset]

    step = start_step
    while True:
        first = step * cfg.batch_size
        if size >= 10**9:  # procedural: just take the next indices
            indices = list(range(first, first + cfg.batch_size))
        else:
            indices = [position_to_index(p) for p in range(first, first + cfg.batch_size)]
        if hasattr(source, "batch"):
            yield source.batch(indices)[0]
        else:
            yield stack_images(source[i] for i in indices)
        step += 1
