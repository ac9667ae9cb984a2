"""Encode an image-text folder or WebDataset shards with a VQGAN once, into token shards (format: tokens.py).

    pretokenize(source, out, vae)          # the library; its command line is dalle_lab.training.pretokenize:
    python -m dalle_lab.training.pretokenize --image_text_folder data/ --out tokens/ \
        --vqgan_model_path vqgan.ckpt --vqgan_config_path vqgan.yaml
    python train_dalle.py --image_text_folder tokens/ --bpe_path my.model    # no VQGAN encoder while training

Why: every training step would otherwise run the VQGAN encoder on its batch (for an f16 VQGAN at 256 px that costs
as much as the transformer, see docs/training.md), and the codes of an image never change.

Input shard k of a WebDataset (or items [k*S, (k+1)*S) of a folder, S = --shard_size) become output shard k,
written atomically (temporary file + rename), and index.json is rewritten after each shard: a killed run is
continued by the same command, from the first shard it had not finished. Unusable items (corrupt image, no or
empty caption) are named in a warning, recorded in index.json and counted in the summary; they never stop the run.
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np

from . import tokens as fmt

logger = logging.getLogger(__name__)


def pretokenize(source: str, out, vae, *, wds: bool = False, shard_size: int = 1000, batch_size: int = 32,
                num_workers: int = 0, progress: bool = True) -> dict:
    """Write the token shards of `source` (a folder, or shard urls with wds=True) into `out`; returns index.json's
    contents. `vae` is the image tokenizer (a VQGanVAE), already on its device."""
    out = Path(out).expanduser()
    chunks, source_items, indexing_skipped = (_shard_chunks(source, vae.image_size) if wds else
                                              _folder_chunks(source, vae.image_size, shard_size, num_workers))
    settings = {"source": source if wds else str(Path(source).expanduser().resolve()), "wds": wds,
                "shard_size": None if wds else shard_size, "source_items": source_items}
    index = _start_index(out, settings, vae)
    if index["complete"]:
        logger.warning("%s is already complete (%d items)", out, index["items"])
        return index
    index["indexing_skipped"] = indexing_skipped
    dtype = fmt.token_dtype(vae.num_tokens)
    from tqdm.auto import tqdm

    done_items = sum(entry["items"] + len(entry["skipped"]) for entry in index["shards"])
    bar = tqdm(total=source_items, initial=done_items, unit="img", desc="pretokenize", disable=not progress,
               dynamic_ncols=True)
    for number in range(len(index["shards"]), len(chunks)):  # resume: the shards already written are kept
        keys, captions, codes, skipped, pending = [], [], [], [], []

        def flush():
            if pending:
                import torch

                images = torch.stack([image for image, _, _ in pending])
                codes.append(vae.get_codebook_indices(images.to(vae.device)).cpu().numpy().astype(dtype))
                keys.extend(key for _, key, _ in pending)
                captions.extend(lines for _, _, lines in pending)
                bar.update(len(pending))
                pending.clear()

        for key, image, lines, problem in chunks[number]():
            if problem is not None:
                logger.warning("skipping %s: %s", key, problem)
                skipped.append({"item": key, "reason": problem})
                bar.update(1)
                continue
            pending.append((image, key, lines))
            if len(pending) == batch_size:
                flush()
        flush()
        grid = np.concatenate(codes) if codes else np.zeros((0, vae.image_seq_len), dtype)
        index["shards"].append(_write_shard(out, number, grid, keys, captions, skipped))
        index["items"] = sum(entry["items"] for entry in index["shards"])
        _write_index(out, index)
    bar.close()
    index["complete"] = True
    _write_index(out, index)
    logger.warning("%s", summary(index))
    return index


def summary(index: dict) -> str:
    """One line of counts, then the skipped items by reason (the first few named)."""
    skipped = [s for entry in index["shards"] for s in entry["skipped"]] + index.get("indexing_skipped", [])
    lines = [f"{index['items']} images tokenized into {len(index['shards'])} shards "
             f"({index['fmap_size']}x{index['fmap_size']} codes of {index['num_tokens']}), {len(skipped)} skipped"]
    for s in skipped[:10]:
        lines.append(f"  skipped {s['item']}: {s['reason']}")
    if len(skipped) > 10:
        lines.append(f"  ... {len(skipped) - 10} more in index.json")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ sources
# Each source is a list of chunks; a chunk is a callable yielding (key, image, caption lines, problem) for every
# input item of one output shard, in a fixed order (problem: None, or why the item is skipped).

def _folder_chunks(root, image_size: int, shard_size: int, num_workers: int):
    from .folder import TextImageFolder

    folder = TextImageFolder(root, image_size=image_size)
    report = folder.report  # what indexing found: images without (usable) caption files, unidentifiable images
    skipped = [{"item": key, "reason": "no caption file"} for key in report.missing_caption] + \
              [{"item": key, "reason": "empty caption file"} for key in report.empty_caption] + \
              [{"item": key, "reason": "corrupt image (cannot be decoded)"} for key in report.corrupt_image]

    def chunk(start: int):
        def items():
            from torch.utils.data import DataLoader

            positions = range(start, min(start + shard_size, len(folder)))
            # workers decode images in parallel; a corrupt one comes back as None (its worker logs the error)
            loader = DataLoader(_Images(folder, positions), batch_size=None, num_workers=num_workers)
            for position, image in zip(positions, loader):
                key = folder.keys[position]
                problem = "corrupt image (cannot be decoded)" if image is None else None
                yield key, image, folder.captions(position), problem
        return items

    return [chunk(start) for start in range(0, len(folder), shard_size)], len(folder), skipped


class _Images:
    def __init__(self, folder, positions):
        self.folder, self.positions = folder, list(positions)

    def __len__(self):
        return len(self.positions)

    def __getitem__(self, i):
        return self.folder.load(self.positions[i])


def _shard_chunks(urls, image_size: int):
    from .wds import BadSample, expand_urls, read_sample, sample_location, shard_samples

    shards = expand_urls(urls)
    if not shards:
        raise ValueError(f"no WebDataset shards in {urls!r}")

    def chunk(url: str):
        def items():
            for sample in shard_samples(url):
                where = sample_location(sample)
                try:
                    image, lines = read_sample(sample, image_size)
                except BadSample as error:
                    yield where, None, None, str(error)
                    continue
                yield where, image, lines, None
        return items

    return [chunk(url) for url in shards], None, []


# ------------------------------------------------------------------------------------------------ writing

def _start_index(out: Path, settings: dict, vae) -> dict:
    """A fresh index, or the one a killed run left (continued only if it was made from the same source with the
    same VQGAN and shard size)."""
    identity = vae.identity
    if (out / fmt.INDEX).is_file():
        index = fmt.read_index(out)
        if index["settings"] != settings or index["vae"].get("sha256") != identity["sha256"]:
            raise ValueError(f"{out} already holds tokens of {index['settings']['source']} made with "
                             f"{index['vae'].get('model_path')}; this run encodes {settings['source']} with "
                             f"{identity.get('model_path')} (shard size {settings['shard_size']}): choose another "
                             f"--out or delete {out}")
        return index
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not a pre-tokenized directory: choose an empty or new --out")
    return {"format": fmt.FORMAT, "vae": identity, "image_size": vae.image_size, "fmap_size": vae.fmap_size,
            "num_tokens": vae.num_tokens, "dtype": np.dtype(fmt.token_dtype(vae.num_tokens)).name,
            "settings": settings, "items": 0, "shards": [], "complete": False}


def _write_shard(out: Path, number: int, grid, keys, captions, skipped) -> dict:
    from dalle_lab.utils import atomic_write

    tokens_name, captions_name = fmt.shard_files(number)

    def save_npy(tmp):
        with open(tmp, "wb") as handle:  # np.save on a path would append ".npy" to the temporary name
            np.save(handle, grid)

    atomic_write(out / tokens_name, save_npy)
    text = json.dumps({"keys": keys, "captions": captions}, ensure_ascii=False)
    atomic_write(out / captions_name, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return {"tokens": tokens_name, "captions": captions_name, "items": len(keys), "skipped": skipped}


def _write_index(out: Path, index: dict) -> None:
    from dalle_lab.utils import atomic_write

    text = json.dumps(index, indent=1, ensure_ascii=False)
    atomic_write(out / fmt.INDEX, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


if __name__ == "__main__":  # the command line moved up to training/, where the run's VQGAN is chosen
    sys.exit("the command is python -m dalle_lab.training.pretokenize (same flags)")
