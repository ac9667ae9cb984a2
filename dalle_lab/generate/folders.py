"""Captions to images with a trained DALLE: the library side of generate.py and of the sample grids the training
loop writes. Generation itself is generation.generate; this module tokenizes, batches, seeds, decodes pixels and
writes files.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

import torch
from PIL import Image
from tqdm.auto import tqdm

from dalle_lab.tokenizers import check_vocab_fits
from dalle_lab.utils import atomic_write
from dalle_lab.vae.images import decode_images
from dalle_lab.image_grid import save_grid, to_uint8

from .config import GenerationConfig
from .generation import generate
from .text import generate_texts


def tokenize_captions(tokenizer, captions, text_seq_len: int, num_text_tokens: int, truncate: bool = False):
    """Token ids for captions, with the user-facing errors generate.py needs (caption too long, vocab too big)."""
    check_vocab_fits(tokenizer, num_text_tokens)
    return tokenizer.tokenize(list(captions), text_seq_len, truncate_text=truncate)


@torch.no_grad()
def sample_images(dalle, vae, tokenizer, captions, config: GenerationConfig, seed: int = 0, batch_size: int = 16,
                  truncate: bool = False):
    """Images (len(captions), 3, H, W) in [0, 1] for a list of captions, reproducible from `seed`.

    Uses its own torch.Generator, so sampling in the middle of training never disturbs the training RNG.
    """
    cfg = dalle.config
    device = next(dalle.parameters()).device
    text = tokenize_captions(tokenizer, captions, cfg.text_seq_len, cfg.num_text_tokens, truncate)
    generator = torch.Generator(device=device).manual_seed(seed)
    chunks = []
    for start in range(0, len(captions), batch_size):
        tokens, _ = generate(dalle, text[start:start + batch_size].to(device), config, generator=generator)
        chunks.append(decode_images(vae, tokens.to(vae.device)).float().cpu())
    return torch.cat(chunks)


@torch.no_grad()
def complete_captions(dalle, tokenizer, captions, config: GenerationConfig, seed: int = 0, truncate: bool = False,
                      filter_thres: float | None = None) -> list[str]:
    """Each caption continued by the model's text head (generate.py --gentxt), decoded: the caption is a prefix and
    the rest of the text context is sampled (text.py). Reproducible from `seed`; top_k (or DALLE-pytorch's
    filter_thres), top_p and temperature act on the text vocabulary; guidance does not apply."""
    cfg = dalle.config
    device = next(dalle.parameters()).device
    text = tokenize_captions(tokenizer, captions, cfg.text_seq_len, cfg.num_text_tokens, truncate).to(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    filled = generate_texts(dalle, text, top_k=None if filter_thres is not None else config.top_k,
                            filter_thres=filter_thres, top_p=config.top_p, temperature=config.temperature,
                            generator=generator)
    return [tokenizer.decode(row) for row in filled.cpu()]


def caption_dirname(caption: str, max_len: int = 120) -> str:
    """A folder name for a caption: spaces -> underscores, anything unsafe in a file name dropped."""
    name = re.sub(r"\s+", "_", caption.strip())
    name = re.sub(r"[^\w\-.,]", "", name)[:max_len].strip(".")
    return name or "caption"


def claim_caption_folders(outputs_dir: str | os.PathLike, captions, overwrite: bool = False) -> None:
    """Check each caption's folder before anything is sampled, so manifest.jsonl lists exactly the images on disk:
    two captions may not share a folder, and a folder an earlier run wrote into (images there, or manifest lines
    naming it) is refused - or, with `overwrite`, emptied first of its images, attention maps and manifest lines."""
    outputs_dir = Path(outputs_dir)
    owners: dict[str, str] = {}
    folded: dict[str, str] = {}  # folder names that differ only in case are one folder on macOS and Windows
    for caption in captions:
        name = caption_dirname(caption)
        if name.casefold() in folded:
            raise ValueError(f"the captions {folded[name.casefold()]!r} and {caption!r} would both write to "
                             f"{outputs_dir / name} (folder names are compared ignoring case): give each caption once")
        owners[name] = folded[name.casefold()] = caption
    manifest = outputs_dir / "manifest.jsonl"
    lines = manifest.read_text(encoding="utf-8").splitlines(keepends=True) if manifest.is_file() else []
    listed = {_record_folder(line) for line in lines}
    used = [name for name in owners if name in listed or any((outputs_dir / name).glob("*.png"))]
    if used and not overwrite:
        more = f" (and {len(used) - 1} more of these captions' folders)" if len(used) > 1 else ""
        raise ValueError(f"{outputs_dir / used[0]} already holds images of an earlier run{more}: give another "
                         "--outputs_dir, or --overwrite to replace them (their manifest.jsonl lines go too)")
    for name in used:
        for image in (outputs_dir / name).glob("*.png"):
            image.unlink()
        shutil.rmtree(outputs_dir / name / "attention", ignore_errors=True)
    if used:
        kept = "".join(line for line in lines if _record_folder(line) not in used)
        atomic_write(manifest, lambda tmp: Path(tmp).write_text(kept, encoding="utf-8"))


def _record_folder(line: str) -> str | None:
    """The caption folder a manifest line's image lies in (None for a line that is not a record)."""
    try:
        return Path(json.loads(line)["file"]).parts[0]
    except (ValueError, KeyError, TypeError, IndexError):
        return None


def generate_to_folder(dalle, vae, tokenizer, captions, outputs_dir: str | os.PathLike, num_images: int = 4,
                       batch_size: int = 16, config: GenerationConfig | None = None, seed: int = 0,
                       checkpoint: str | None = None, grid: bool = True, truncate: bool = False,
                       overwrite: bool = False, progress: bool = False) -> list[dict]:
    """For each caption: outputs_dir/<caption_with_underscores>/<i>.png, grid.png, and one manifest line per image
    in outputs_dir/manifest.jsonl (appended caption by caption, so several calls with other captions share one
    manifest, and a run cut short lists exactly the images it wrote). A caption folder an earlier call wrote into
    is refused unless `overwrite` (claim_caption_folders). `progress`: a tqdm bar over the captions. Returns the
    manifest records.

    Caption number c is sampled from a generator seeded with seed + c, so the whole call is reproducible from `seed`
    and a caption's images do not change when other captions are added after it.
    """
    config = config or GenerationConfig()
    outputs_dir = Path(outputs_dir)
    # tokenize everything first: a caption that is too long fails before any time is spent sampling
    cfg = dalle.config
    tokenize_captions(tokenizer, captions, cfg.text_seq_len, cfg.num_text_tokens, truncate)
    claim_caption_folders(outputs_dir, captions, overwrite)
    outputs_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for c, caption in enumerate(tqdm(captions, disable=not progress, unit="caption", file=sys.stderr)):
        images = sample_images(dalle, vae, tokenizer, [caption] * num_images, config, seed=seed + c,
                               batch_size=batch_size, truncate=truncate)
        folder = outputs_dir / caption_dirname(caption)
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for i, array in enumerate(to_uint8(images)):
            file = folder / f"{i}.png"
            Image.fromarray(array).save(file)
            written.append({"caption": caption, "file": str(file.relative_to(outputs_dir)), "index": i,
                            "seed": seed + c, "checkpoint": checkpoint, **asdict(config)})
        if grid:
            save_grid(images, folder / "grid.png", scale=4 if images.shape[-1] <= 64 else 1)
        with open(outputs_dir / "manifest.jsonl", "a", encoding="utf-8") as manifest:
            manifest.writelines(json.dumps(record) + "\n" for record in written)
        records += written
    return records
