"""Image-text folders in the DALLE-pytorch format.

    root/
      cats/001.jpg   cats/001.txt      one or more captions, one a line; one line per access (see `get`)
      dogs/001.png   dogs/001.txt      same stem in another folder: a different item (keyed by relative path)

Images: .png .jpg .jpeg .bmp .webp (any case), found recursively. The caption file is the image's path with the
extension replaced by .txt. Bad data is reported and skipped, never silently dropped and never a crash:
- an image without a caption file, or whose caption file has no non-blank line: found while indexing;
- an image PIL cannot decode: found when it is loaded (or while indexing with `verify_images=True`); the item is
  replaced by the next good one.
`dataset.report` holds the counts and relative paths; a summary is logged as a warning.
"""
from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from torch.utils.data import Dataset

from .transforms import load_image

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
_NAMES_IN_SUMMARY = 5


@dataclass
class FolderReport:
    """What indexing and loading an image-text folder found. Paths are relative to `root`."""

    root: str
    images: int = 0  # usable image-caption pairs
    missing_caption: list[str] = field(default_factory=list)  # images without a .txt
    empty_caption: list[str] = field(default_factory=list)  # .txt without a non-blank line
    corrupt_image: list[str] = field(default_factory=list)  # images PIL could not decode
    long_caption: list[str] = field(default_factory=list)  # images left with no caption short enough (skipped)
    long_caption_lines: int = 0  # caption lines longer than text_seq_len, left out (skip_long_captions)
    orphan_captions: list[str] = field(default_factory=list)  # .txt files without an image (informational)

    @property
    def skipped(self) -> int:
        return len(self.missing_caption) + len(self.empty_caption) + len(self.corrupt_image) + len(self.long_caption)

    def summary(self) -> str:
        def names(paths: list[str]) -> str:
            shown = ", ".join(paths[:_NAMES_IN_SUMMARY])
            return shown + (f", ... ({len(paths) - _NAMES_IN_SUMMARY} more)" if len(paths) > _NAMES_IN_SUMMARY else "")

        lines = [f"{self.root}: {self.images} usable image-caption pairs, {self.skipped} skipped"]
        for label, paths in (("no caption file", self.missing_caption), ("empty caption file", self.empty_caption),
                             ("corrupt image", self.corrupt_image),
                             ("every caption longer than text_seq_len", self.long_caption),
                             ("caption file without an image (ignored)", self.orphan_captions)):
            if paths:
                lines.append(f"  {label}: {len(paths)} ({names(paths)})")
        if self.long_caption_lines:
            lines.append(f"  caption lines longer than text_seq_len, left out: {self.long_caption_lines}")
        return "\n".join(lines)


def _read_captions(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    return [line.strip() for line in text.splitlines() if line.strip()]


def _scan(root: Path) -> tuple[list[Path], dict[Path, Path]]:
    """Image files sorted by relative path (every process indexes the same order) and caption files by path minus suffix."""
    images, texts = [], {}
    for directory, _, files in os.walk(root, followlinks=True):
        for name in files:
            path = Path(directory, name)
            suffix = path.suffix.lower()
            if suffix in IMAGE_EXTENSIONS:
                images.append(path)
            elif suffix == ".txt":
                texts[path.with_suffix("")] = path
    images.sort(key=lambda path: path.relative_to(root).as_posix())
    return images, texts


def _check_root(root) -> Path:
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"image-text folder {str(root)!r} does not exist or is not a directory")
    return root


class CaptionLines:
    """Items with one or more caption lines each, and the caption checks training runs before step 1. Shared by
    TextImageFolder and the pre-tokenized TokenShards (tokens.py); a subclass holds `keys`, `_captions` (a list of
    lines per item) and `report` (a FolderReport), and says where an item's captions came from (`_caption_source`
    for messages, `_caption_key` for the unknown-word report) and how to drop items (`_keep`)."""

    def caption_lines_by_file(self) -> dict[str, list[str]]:
        """Every usable caption line, keyed by its caption file (relative path)."""
        return {self._caption_key(i): list(lines) for i, lines in enumerate(self._captions)}

    def check_caption_lengths(self, count_tokens, text_seq_len: int, mode: str = "error") -> None:
        """Check every caption line against text_seq_len before training: `count_tokens(list of captions)` gives
        their token counts. mode "error": ValueError naming the first too-long line's file and line number;
        "truncate": nothing to do (the tokenizer cuts); "skip": leave such lines out, and images left without a
        line out of the dataset, counted in the report like corrupt images."""
        if mode == "truncate":
            return
        flat = [(i, n, line) for i, lines in enumerate(self._captions) for n, line in enumerate(lines, 1)]
        lengths = count_tokens([line for _, _, line in flat])
        long = [(i, n, line, tokens) for (i, n, line), tokens in zip(flat, lengths) if tokens > text_seq_len]
        if not long:
            return
        if mode == "error":
            i, n, line, tokens = long[0]
            from dalle_lab.tokenizers.base import shorten

            more = f" ({len(long) - 1} more such lines)" if len(long) > 1 else ""
            raise ValueError(f"{self._caption_source(i)}, line {n}: caption {shorten(line)} is {tokens} tokens long but "
                             f"text_seq_len is {text_seq_len}{more}: pass --truncate_captions to cut such captions, "
                             f"--skip_long_captions to leave them out, or a larger --text_seq_len")
        drop = {(i, n) for i, n, _, _ in long}
        kept = []
        for i, key in enumerate(self.keys):
            lines = [line for n, line in enumerate(self._captions[i], 1) if (i, n) not in drop]
            if lines:
                self._captions[i] = lines
                kept.append(i)
            else:
                self.report.long_caption.append(key)
        self.report.long_caption_lines += len(long)
        self._keep(kept)
        self.report.images = len(self.keys)
        logger.warning("image-text folder: %s", self.report.summary())
        if not self.keys:
            raise ValueError(f"every caption in {str(self.report.root)!r} is longer than text_seq_len {text_seq_len}: "
                             f"raise --text_seq_len or pass --truncate_captions")

    def captions(self, index: int) -> list[str]:
        return list(self._captions[index])


class TextImageFolder(CaptionLines, Dataset):
    """Items `(image (3,H,W) float in [0,1], caption)`, or `(text_tokens (text_seq_len,), image)` with a tokenizer.

    Images are scaled (shorter side to `image_size`) and centre-cropped; with crop_lower_ratio < 1 a random square
    covering at least that fraction of the largest square is cut out instead (transforms.random_square_crop), drawn
    from the item's caption draw, so training crops depend on (seed, epoch, position) only. A caption that does not
    fit `text_seq_len` raises a ValueError naming its file unless `truncate_captions=True`.
    """

    def __init__(self, root, image_size: int = 32, tokenizer=None, text_seq_len: int | None = None,
                 truncate_captions: bool = False, verify_images: bool = False, crop_lower_ratio: float = 1.0):
        self.root = _check_root(root)
        if not 0.0 < crop_lower_ratio <= 1.0:
            raise ValueError(f"--random_resize_crop_lower_ratio {crop_lower_ratio} must be in (0, 1] (DALLE-pytorch "
                             "used 0.75; 1 is the centre crop)")
        self.crop_lower_ratio = crop_lower_ratio
        if tokenizer is not None and not text_seq_len:
            raise ValueError("TextImageFolder with a tokenizer needs text_seq_len (the model's text context length)")
        self.image_size, self.tokenizer = int(image_size), tokenizer
        self.text_seq_len, self.truncate_captions = text_seq_len, truncate_captions
        self.report = FolderReport(str(self.root))

        images, texts = _scan(self.root)
        self.keys: list[str] = []  # relative image paths: unique even when stems repeat across folders
        self._images: list[Path] = []
        self._captions: list[list[str]] = []
        self._caption_files: list[Path] = []
        used_texts = set()
        for image in images:
            key = image.relative_to(self.root).as_posix()
            caption_file = texts.get(image.with_suffix(""))
            if caption_file is None:
                self.report.missing_caption.append(key)
                continue
            used_texts.add(caption_file)
            captions = _read_captions(caption_file)
            if not captions:
                self.report.empty_caption.append(key)
                continue
            if verify_images and not self._verify(image, key):
                continue
            self.keys.append(key)
            self._images.append(image)
            self._captions.append(captions)
            self._caption_files.append(caption_file)
        self.report.orphan_captions = sorted(
            p.relative_to(self.root).as_posix() for p in set(texts.values()) - used_texts)
        self.report.images = len(self.keys)
        if self.report.skipped or self.report.orphan_captions:
            logger.warning("image-text folder: %s", self.report.summary())
        if not self.keys:
            raise ValueError(f"no usable image-caption pairs in {str(self.root)!r}: each image "
                             f"({', '.join(IMAGE_EXTENSIONS)}) needs a same-stem .txt with at least one caption line."
                             f"\n{self.report.summary()}")

    def _verify(self, image: Path, key: str) -> bool:
        from PIL import Image

        try:
            with Image.open(image) as handle:
                handle.load()
            return True
        except Exception as error:  # PIL raises many types for bad files
            self._mark_corrupt(key, error)
            return False

    def _mark_corrupt(self, key: str, error: Exception) -> None:
        if key not in self.report.corrupt_image:
            self.report.corrupt_image.append(key)
            self.report.images -= 1
            logger.warning("skipping corrupt image %s in %s (%s: %s)", key, self.root, type(error).__name__, error)

    def __len__(self) -> int:
        return len(self.keys)

    def _caption_source(self, index: int) -> str:
        return str(self._caption_files[index])

    def _caption_key(self, index: int) -> str:
        return self._caption_files[index].relative_to(self.root).as_posix()

    def _keep(self, positions: list[int]) -> None:
        self.keys = [self.keys[i] for i in positions]
        self._images = [self._images[i] for i in positions]
        self._captions = [self._captions[i] for i in positions]
        self._caption_files = [self._caption_files[i] for i in positions]

    def load(self, index: int):
        """Item `index`'s image, or None when it cannot be decoded (reported once, like `get` does): for tools that
        visit every item once (pre-tokenizing) and must count what they skip rather than substitute another item."""
        key = self.keys[index]
        if key in self.report.corrupt_image:
            return None
        try:
            return load_image(self._images[index], self.image_size)
        except Exception as error:  # PIL raises many types for bad files
            self._mark_corrupt(key, error)
            return None

    def _tokenize(self, caption: str, index: int):
        try:
            return self.tokenizer.tokenize([caption], self.text_seq_len, truncate_text=self.truncate_captions)[0]
        except ValueError as error:
            raise ValueError(f"{self._caption_files[index]}: {error} (pass truncate_captions=True / "
                             f"--truncate_captions to cut long captions, or raise text_seq_len)") from error

    def __getitem__(self, index: int):
        """An item with a caption line drawn from Python's `random` (seed it yourself); training uses `get`."""
        return self.get(index)

    def get(self, index: int, caption_draw: int | None = None):
        """Item `index` with caption line `caption_draw % lines` (None: a `random` line). Training passes a draw
        derived from (seed, epoch, position), so the caption never depends on which worker loads the item."""
        # A corrupt image is reported once and replaced by the next item, so one bad file never stops training.
        for attempt in range(len(self.keys)):
            position = (index + attempt) % len(self.keys)
            key = self.keys[position]
            if key in self.report.corrupt_image:
                continue
            # the crop's randomness comes from the same draw as the caption (random's own when there is none)
            rng = random.Random(caption_draw) if caption_draw is not None else random
            try:
                image = load_image(self._images[position], self.image_size, self.crop_lower_ratio, rng)
            except Exception as error:
                self._mark_corrupt(key, error)
                continue
            lines = self._captions[position]
            caption = random.choice(lines) if caption_draw is None else lines[caption_draw % len(lines)]
            if self.tokenizer is None:
                return image, caption
            return self._tokenize(caption, position), image
        raise RuntimeError(f"every image in {str(self.root)!r} failed to load:\n{self.report.summary()}")


def iter_folder_captions(root) -> Iterator[str]:
    """Every non-blank caption line of every image's caption file under root (for training a vocabulary)."""
    root = _check_root(root)
    images, texts = _scan(root)
    seen = set()  # photo.png and photo.jpg share photo.txt: read it once
    for image in images:
        caption_file = texts.get(image.with_suffix(""))
        if caption_file is not None and caption_file not in seen:
            seen.add(caption_file)
            yield from _read_captions(caption_file)
