"""The images and embeddings a parity report compares on: a folder of images, a folder of CLIP embeddings (.npy),
samples of a DALLE checkpoint, Twemoji drawings. Each returns its items with their names, so a report can name the
image that moved most.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from dalle_lab.data.emoji import EmojiDataset
from dalle_lab.generate import GenerationConfig, generate
from dalle_lab.training.checkpoint import load_dalle
from dalle_lab.vae.images import decode_images

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


def load_image_folder(folder, max_images: int | None = None):
    """(list of (3,H,W) float tensors in [0,1], list of file names) for the images in `folder`, sorted by name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"image folder {folder} not found")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)[:max_images]
    if not files:
        raise ValueError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {folder}")
    images, names = [], []
    for file in files:
        try:
            with Image.open(file) as image:
                array = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
        except OSError as error:
            raise ValueError(f"cannot read image {file}: {error}") from error
        images.append(torch.from_numpy(array).permute(2, 0, 1).contiguous())
        names.append(file.name)
    return images, names


def load_embedding_folder(folder):
    """(N, D) float32 embeddings from the .npy files of `folder` (each (D,) or (k, D)), sorted naturally by name."""
    def natural(path):  # rating2 before rating10
        return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]

    folder = Path(folder)
    files = sorted(folder.glob("*.npy"), key=natural)
    if not files:
        raise ValueError(f"no .npy embedding files in {folder}")
    arrays = []
    for file in files:
        array = np.load(file).astype(np.float32)
        arrays.append(array.reshape(-1, array.shape[-1]))
    names = [file.stem if len(a) == 1 else f"{file.stem}[{i}]" for file, a in zip(files, arrays) for i in range(len(a))]
    return torch.from_numpy(np.concatenate(arrays)), names


def generate_dalle_images(dalle_path, prompts, config: GenerationConfig, device="cpu", seed: int = 0):
    """Images sampled by a DALLE checkpoint for `prompts` (one each, one batch, drawn as `config` says from a
    generator seeded with `seed`): ((B,3,H,W) in [0,1], prompts)."""
    dalle, tokenizer, vae = load_dalle(dalle_path, device=device)
    text = tokenizer.tokenize(list(prompts), dalle.config.text_seq_len, truncate_text=True).to(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        tokens, _ = generate(dalle, text, config, generator=generator)
        images = decode_images(vae, tokens)
    return images.float().clamp(0, 1).cpu(), list(prompts)


def emoji_images(n: int, image_size: int, seed: int):
    """n Twemoji drawings (all split), chosen by a seeded permutation, and their names."""
    dataset = EmojiDataset("all", image_size=image_size)
    picks = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:n].tolist()
    items = [dataset[i] for i in picks]
    return torch.stack([image for image, _ in items]), [name for _, name in items]
