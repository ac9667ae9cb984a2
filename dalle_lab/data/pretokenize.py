"""Encode an image-text folder or WebDataset shards with a VQGAN once, into token shards (format: tokens.py).

    python -m dalle_lab.data.pretokenize --image_text_folder data/ --out tokens/
    python -m dalle_lab.data.pretokenize --image_text_folder 'shards/{000..009}.tar' --wds jpg,txt \
        --vqgan_model_path vqgan.ckpt --vqgan_config_path vqgan.yaml --out tokens/ --device cuda
    python train_dalle.py --image_text_folder tokens/          # trains without running the VQGAN encoder

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
    report = folder.report  # what indexing found: images without (usable) caption files
    skipped = [{"item": key, "reason": "no caption file"} for key in report.missing_caption] + \
              [{"item": key, "reason": "empty caption file"} for key in report.empty_caption]

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


# ------------------------------------------------------------------------------------------------ command line

def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m dalle_lab.data.pretokenize", description=__doc__.split("\n")[0])
    parser.add_argument("--image_text_folder", required=True, help="folder of images + .txt, or shard urls with --wds")
    parser.add_argument("--wds", default=None, help="read WebDataset shards (e.g. jpg,txt, as train_dalle.py)")
    parser.add_argument("--out", required=True, help="output directory (created; a killed run's is continued)")
    parser.add_argument("--vqgan_model_path", default=None, help="taming VQGAN .ckpt (none: --dataset's default)")
    parser.add_argument("--vqgan_config_path", default=None, help="taming VQGAN .yaml")
    parser.add_argument("--dataset", default="shapes", help="whose default image tokenizer to use without --vqgan_*")
    parser.add_argument("--shard_size", type=int, default=1000, help="images per output shard (folders)")
    parser.add_argument("--batch_size", type=int, default=32, help="images per VQGAN forward")
    parser.add_argument("--num_workers", type=int, default=0, help="image-decoding workers (folders)")
    parser.add_argument("--device", default="auto", help="auto|cpu|cuda")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        vae = load_tokenizer(args.vqgan_model_path, args.vqgan_config_path, args.dataset)
        from dalle_lab.utils import pick_device

        vae = vae.to(pick_device(args.device))
        index = pretokenize(args.image_text_folder, args.out, vae, wds=bool(args.wds), shard_size=args.shard_size,
                            batch_size=args.batch_size, num_workers=args.num_workers, progress=args.progress)
    except (FileNotFoundError, ValueError) as error:
        print(f"pretokenize: error: {error}", file=sys.stderr)
        return 1
    print(f"train: python train_dalle.py --image_text_folder {args.out}")
    return 0


def load_tokenizer(model_path, config_path, dataset: str = "shapes"):
    """The VQGAN named by paths, else the built-in dataset's default one (as train_dalle.py chooses)."""
    if (model_path is None) != (config_path is None):
        raise ValueError("give both --vqgan_model_path (.ckpt) and --vqgan_config_path (.yaml), or neither")
    if model_path:
        from dalle_lab.vae import VQGanVAE

        return VQGanVAE(model_path, config_path)
    from dalle_lab.vae import default_vae

    return default_vae(dataset=dataset)


if __name__ == "__main__":
    sys.exit(main())
