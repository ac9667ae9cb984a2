"""Pre-tokenized data: images encoded once by a VQGAN into code ids, stored with all their captions.

Written by `python -m dalle_lab.training.pretokenize` (data/pretokenize.py does the work); read by training when
--image_text_folder names a directory holding an `index.json` of this format:

    tokens/
      index.json              format, the VQGAN's identity (path + sha256, as checkpoints record it), image size,
                              token grid side, codebook size, dtype, the source, every shard and every skipped item
      tokens-00000.npy        (items, fmap_size**2) code ids, int16 (codebooks up to 32768) or int32, row-major
      captions-00000.json     {"keys": [source key per item], "captions": [[every caption line of the item], ...]}
      ...

Why .npy shards with an index rather than WebDataset tars of per-sample files: a code grid is tiny (256 codes x 2
bytes = 512 bytes for an f16 VQGAN at 256 px, so 10M images are 5 GB), so the token arrays are memory-mapped and
read by random access. That lets them go through the same seeded epoch order, rank split and caption draw as an
image-text folder (training/batches.py FolderBatches): training from the tokens of a folder is step for step the
same run as training on the folder itself, and a resume seeks to its (epoch, batch) instead of replaying a stream.
Ranks take rank-strided positions of the epoch's order and DataLoader workers take whole batches, as for folders.
The captions (a few hundred bytes per item) are held in memory.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from .folder import CaptionLines
from .folder_report import FolderReport

FORMAT = "dalle_lab.tokens/1"
INDEX = "index.json"


def token_dtype(num_tokens: int):
    """The smallest signed integer type that holds every code id of a codebook (torch has no uint16 ops)."""
    return np.int16 if num_tokens <= 2**15 else np.int32


def shard_files(index: int) -> tuple[str, str]:
    return f"tokens-{index:05d}.npy", f"captions-{index:05d}.json"


def is_token_dir(path) -> bool:
    """Does `path` hold pre-tokenized data (an index.json of this format)? Shard patterns and folders: no."""
    index = Path(str(path)).expanduser() / INDEX
    if not index.is_file():
        return False
    try:
        return json.loads(index.read_text()).get("format") == FORMAT
    except (OSError, ValueError):
        return False


def read_index(root) -> dict:
    root = Path(root).expanduser()
    try:
        index = json.loads((root / INDEX).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{root / INDEX} is not a readable pre-tokenized index ({error})") from error
    if index.get("format") != FORMAT:
        raise ValueError(f"{root / INDEX} has format {index.get('format')!r}, expected {FORMAT!r}")
    return index


def check_vae(index: dict, vae_identity: dict, root) -> None:
    """The tokens mean something only to the VQGAN that made them: refuse another one, in one line naming both."""
    made = index["vae"]
    if made.get("sha256") != vae_identity.get("sha256") or made.get("kind") != vae_identity.get("kind"):
        raise ValueError(
            f"{root} was tokenized with the VQGAN {_describe(made)}, but this run uses {_describe(vae_identity)}: "
            f"leave out --vqgan_model_path/--vqgan_config_path to use the recorded one, or pretokenize again")


def _describe(identity: dict) -> str:
    return f"{identity.get('model_path') or identity.get('kind')} (sha256 {str(identity.get('sha256'))[:12]})"


class TokenShards(CaptionLines, Dataset):
    """Items `(image token ids (fmap_size**2,) long, caption)` of a pre-tokenized directory; like TextImageFolder,
    `get(index, caption_draw)` picks caption line `draw % lines`, so training draws captions the same way."""

    def __init__(self, root):
        self.root = Path(root).expanduser()
        self.index = index = read_index(self.root)
        if not index.get("complete"):
            raise ValueError(f"{self.root} is unfinished ({len(index['shards'])} shards written): run the same "
                             f"pretokenize command again to complete it")
        self.image_size, self.fmap_size = int(index["image_size"]), int(index["fmap_size"])
        self.num_tokens = int(index["num_tokens"])
        self.keys, self._captions, self._where = [], [], []  # _where: (shard, row) per item
        for shard, entry in enumerate(index["shards"]):
            captions = json.loads((self.root / entry["captions"]).read_text())
            if len(captions["keys"]) != entry["items"]:
                raise ValueError(f"{self.root / entry['captions']} holds {len(captions['keys'])} items, the index "
                                 f"says {entry['items']}: the directory was changed after pretokenizing")
            self.keys += captions["keys"]
            self._captions += captions["captions"]
            self._where += [(shard, row) for row in range(entry["items"])]
        self.report = FolderReport(str(self.root), images=len(self.keys))
        self._arrays = {}  # shard -> memory-mapped array, opened lazily in each process (DataLoader workers too)
        if not self.keys:
            raise ValueError(f"{self.root} holds no items (skipped when pretokenizing: "
                             f"{sum(len(e['skipped']) for e in index['shards'])})")

    def __getstate__(self):  # workers re-open their own maps instead of pickling the arrays
        return {**self.__dict__, "_arrays": {}}

    def __len__(self) -> int:
        return len(self.keys)

    def _array(self, shard: int):
        if shard not in self._arrays:
            self._arrays[shard] = np.load(self.root / self.index["shards"][shard]["tokens"], mmap_mode="r")
        return self._arrays[shard]

    def tokens(self, index: int) -> torch.Tensor:
        shard, row = self._where[index]
        return torch.from_numpy(np.asarray(self._array(shard)[row], dtype=np.int64))

    def get(self, index: int, caption_draw: int | None = None):
        import random

        lines = self._captions[index]
        caption = random.choice(lines) if caption_draw is None else lines[caption_draw % len(lines)]
        return self.tokens(index), caption

    def __getitem__(self, index: int):
        return self.get(index)

    # CaptionLines hooks: captions are named by the item's source key (its image's path in the original folder)
    def _caption_source(self, index: int) -> str:
        return f"{self.root} item {self.keys[index]}"

    def _caption_key(self, index: int) -> str:
        return self.keys[index]

    def _keep(self, positions: list[int]) -> None:
        self.keys = [self.keys[i] for i in positions]
        self._captions = [self._captions[i] for i in positions]
        self._where = [self._where[i] for i in positions]
