"""Image-text folders in the DALLE-pytorch format.

    root/
      cats/001.jpg   cats/001.txt      one or more captions, one a line; one line per access (see `get`)
      dogs/001.png   dogs/001.txt      same stem in another folder: a different item (keyed by relative path)

Images: .png .jpg .jpeg .bmp .webp (any case), found recursively. The caption file is the image's path with the
extension replaced by .txt, read as UTF-8. What indexing finds is checked before anything trains on it, and every
problem is one line of `report.summary()` naming the files and the fix (folder_report.py):
- an image without a caption file, or whose caption file has no non-blank line: left out, counted and named;
- a caption file without an image: ignored, counted and named; blank lines inside a caption file: ignored, counted;
- a file with an image extension that PIL cannot identify: left out while indexing (only its header is read);
- an image whose data is cut or broken past its header: found when it is loaded, reported once, counted, and the
  item replaced by the next good one (decoding every image up front would cost minutes on a large folder);
- a caption file that is not UTF-8 text: an error naming the files, before anything trains on mis-read text;
- an empty folder, or none usable: an error.
Grayscale, 16-bit, palette and transparent images are converted to RGB correctly (transforms.to_rgb).
"""
from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import Iterator

from torch.utils.data import Dataset

from .folder_report import FolderReport, names
from .transforms import load_image

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


class CaptionEncodingError(ValueError):
    """Caption files that are not UTF-8 text."""


def read_caption_file(path: Path) -> tuple[list[str], int]:
    """(non-blank caption lines, number of blank lines between them) of a UTF-8 caption file (a BOM is dropped).
    Raises UnicodeDecodeError for other encodings: mis-decoded captions would train the model on garbage."""
    text = path.read_bytes().decode("utf-8-sig")
    lines = [line.strip() for line in text.splitlines()]
    while lines and not lines[-1]:  # a trailing newline (or several) is not a blank caption line
        lines.pop()
    captions = [line for line in lines if line]
    return captions, len(lines) - len(captions)


def _scan(root: Path) -> tuple[list[Path], dict[Path, Path]]:
    """Image files sorted by relative path (every process indexes the same order) and caption files by path minus suffix."""
    images, texts = [], {}
    for directory, _, files in os.walk(root, followlinks=True):
        for name in files:
            if name.startswith("._"):  # macOS AppleDouble metadata ("._photo.png" beside photo.png): not a file of
                continue               # the data, however it is named
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


def _image_mode(path: Path) -> str:
    """The image's PIL mode, from its header alone (tens of microseconds). Raises for a file PIL cannot identify."""
    from PIL import Image

    with Image.open(path) as image:
        return image.mode


def _readable(image: Path, key: str, report: FolderReport, verify_images: bool = False) -> bool:
    """Its header identifies an image PIL can open (and, with verify_images, the whole file decodes); a failure is
    counted in the report with its first reason, a non-RGB mode counted as converted."""
    try:
        mode = _image_mode(image)
        if verify_images:
            load_image(image, 8)
    except Exception as error:  # PIL raises many types for bad files
        report.corrupt_image.append(key)
        report.corrupt_reason.setdefault(key, f"{type(error).__name__}: {error}".replace(str(image), key))
        return False
    report.count_mode(mode, key)
    return True


class CaptionLines:
    """Items with one or more caption lines each. Shared by TextImageFolder and the pre-tokenized TokenShards
    (tokens.py), so training checks both the same way (training/captions.py); a subclass holds `keys`,
    `_captions` (a list of lines per item) and `report` (a FolderReport), and says where an item's captions came
    from (`_caption_source` for messages, `_caption_key` for the unknown-word report) and how to drop items
    (`_keep`)."""

    def caption_lines_by_file(self) -> dict[str, list[str]]:
        """Every usable caption line, keyed by its caption file (relative path)."""
        return {self._caption_key(i): list(lines) for i, lines in enumerate(self._captions)}

    def numbered_caption_lines(self) -> list[tuple[int, int, str]]:
        """(item, line number from 1, caption) for every caption line."""
        return [(i, n, line) for i, lines in enumerate(self._captions) for n, line in enumerate(lines, 1)]

    def caption_source(self, index: int) -> str:
        """Where item `index`'s captions come from, for messages."""
        return self._caption_source(index)

    def drop_caption_lines(self, drop: set[tuple[int, int]]) -> None:
        """Leave out the (item, line number) caption lines, and items left without a line, counted in the report
        (as captions longer than text_seq_len: the one reason training drops lines)."""
        kept = []
        for i, key in enumerate(self.keys):
            lines = [line for n, line in enumerate(self._captions[i], 1) if (i, n) not in drop]
            if lines:
                self._captions[i] = lines
                kept.append(i)
            else:
                self.report.long_caption.append(key)
        self.report.long_caption_lines += len(drop)
        self._keep(kept)
        self.report.images = len(self.keys)

    def captions(self, index: int) -> list[str]:
        return list(self._captions[index])


class TextImageFolder(CaptionLines, Dataset):
    """Items `(image (3,H,W) float in [0,1], caption)`, or `(text_tokens (text_seq_len,), image)` with a tokenizer.

    Images are scaled (shorter side to `image_size`) and centre-cropped; with crop_lower_ratio < 1 a random square
    covering at least that fraction of the largest square is cut out instead (transforms.random_square_crop), drawn
    from the item's caption draw, so training crops depend on (seed, epoch, position) only. A caption that does not
    fit `text_seq_len` raises a ValueError naming its file unless `truncate_captions=True`. `verify_images=True`
    decodes every image while indexing (slow on large folders) instead of only reading its header. The report
    (`report.summary()`) is logged as a warning unless `warn=False`.
    """

    def __init__(self, root, image_size: int = 32, tokenizer=None, text_seq_len: int | None = None,
                 truncate_captions: bool = False, verify_images: bool = False, crop_lower_ratio: float = 1.0,
                 warn: bool = True):
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
        self.keys: list[str] = []  # relative image paths: unique even when stems repeat across folders
        self._images: list[Path] = []
        self._captions: list[list[str]] = []
        self._caption_files: list[Path] = []
        self._index(verify_images)
        if warn and (self.report.problems() or self.report.converted):  # warn=False: the caller reports it
            logger.warning("%s", self.report.summary())

    def _index(self, verify_images: bool) -> None:
        images, texts = _scan(self.root)
        if not images:
            raise ValueError(f"image-text folder {self.root} holds no images ({' '.join(IMAGE_EXTENSIONS)}, found "
                             f"recursively): put the images there, each with a same-name .txt caption file"
                             + (f" ({len(texts)} .txt files found without an image)" if texts else ""))
        used_texts, not_utf8 = set(), []
        for image in images:
            key = image.relative_to(self.root).as_posix()
            caption_file = texts.get(image.with_suffix(""))
            if caption_file is None:
                self.report.missing_caption.append(key)
                continue
            used_texts.add(caption_file)
            try:
                captions, blank = read_caption_file(caption_file)
            except UnicodeDecodeError:
                not_utf8.append(self._relative(caption_file))
                continue
            if blank:
                self.report.blank_lines.append(self._relative(caption_file))
            if not captions:
                self.report.empty_caption.append(key)
                continue
            if not self._readable(image, key, verify_images):
                continue
            self.keys.append(key)
            self._images.append(image)
            self._captions.append(captions)
            self._caption_files.append(caption_file)
        self.report.orphan_captions = sorted(self._relative(p) for p in set(texts.values()) - used_texts)
        self.report.images = len(self.keys)
        if not_utf8:
            first = self.root / not_utf8[0]
            raise CaptionEncodingError(
                f"{len(not_utf8)} caption file(s) in {self.root} are not UTF-8 text ({names(not_utf8)}): convert "
                f"them, e.g. iconv -f latin1 -t utf-8 {first} > tmp.txt && mv tmp.txt {first}")
        if not self.keys:
            raise ValueError(f"no usable image-caption pairs in {self.root} ({self.report.brief()}): each image "
                             f"({' '.join(IMAGE_EXTENSIONS)}) needs a same-name .txt with at least one caption line")

    def _relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def _readable(self, image: Path, key: str, verify_images: bool) -> bool:
        return _readable(image, key, self.report, verify_images)

    def _mark_corrupt(self, key: str, error: Exception) -> None:
        if key not in self.report.corrupt_image:
            self.report.corrupt_image.append(key)
            self.report.images -= 1
            logger.warning("%s/%s cannot be decoded (%s: %s): left out (%d so far); re-save or delete it",
                           self.root, key, type(error).__name__, error, len(self.report.corrupt_image))

    def __len__(self) -> int:
        return len(self.keys)

    def _caption_source(self, index: int) -> str:
        return str(self._caption_files[index])

    def _caption_key(self, index: int) -> str:
        return self._relative(self._caption_files[index])

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
        # A broken image is reported once and replaced by the next item, so one bad file never stops training.
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
        raise RuntimeError(f"every image in {self.root} failed to load ({self.report.brief()}): re-save them or "
                           "replace them")


class ImageFolder(Dataset):
    """Every image under root, captioned or not: what an image tokenizer (train_vae.py) trains on, since it never
    reads a caption. Items `(image (3,H,W) in [0,1], "")`, the same shape as TextImageFolder's. Images PIL cannot
    identify are left out and counted; one that fails to decode later is reported once and replaced by the next."""

    def __init__(self, root, image_size: int = 32, warn: bool = True):
        self.root = _check_root(root)
        self.image_size = int(image_size)
        self.report = FolderReport(str(self.root))
        images, _ = _scan(self.root)
        if not images:
            raise ValueError(f"folder {self.root} holds no images ({' '.join(IMAGE_EXTENSIONS)}, found recursively): "
                             "put the images there")
        self.keys: list[str] = []
        self._images: list[Path] = []
        for image in images:
            key = image.relative_to(self.root).as_posix()
            if _readable(image, key, self.report):
                self.keys.append(key)
                self._images.append(image)
        self.report.images = len(self.keys)
        if not self.keys:
            raise ValueError(f"none of the {len(images)} images in {self.root} can be read ({self.report.brief()}): "
                             "re-save them or replace them")
        if warn and (self.report.corrupt_image or self.report.converted):
            logger.warning("%s", self.summary())

    def summary(self) -> str:
        """The report without the caption lines (captions play no part here)."""
        lines = self.report.summary().splitlines()
        return "\n".join([f"{self.root}: {len(self.keys)} usable images, {len(self.report.corrupt_image)} left out"]
                         + lines[1:])

    def __len__(self) -> int:
        return len(self.keys)

    def load(self, index: int):
        """Image `index`, or None when it cannot be decoded (reported once)."""
        try:
            return load_image(self._images[index], self.image_size)
        except Exception as error:  # PIL raises many types for bad files
            key = self.keys[index]
            if key not in self.report.corrupt_image:
                self.report.corrupt_image.append(key)
                logger.warning("%s/%s cannot be decoded (%s: %s): left out; re-save or delete it", self.root, key,
                               type(error).__name__, error)
            return None

    def __getitem__(self, index: int):
        for attempt in range(len(self.keys)):  # a broken image is replaced by the next good one
            image = self.load((index + attempt) % len(self.keys))
            if image is not None:
                return image, ""
        raise RuntimeError(f"every image in {self.root} failed to load ({self.report.brief()}): re-save them or "
                           "replace them")


def iter_folder_captions(root) -> Iterator[str]:
    """Every non-blank caption line of every image's caption file under root (for training a vocabulary).
    A caption file that is not UTF-8 raises ValueError naming it; a folder with no image that has a caption line
    raises the ValueError training would (naming the folder and what it found), not a bare "no captions"."""
    root = _check_root(root)
    images, texts = _scan(root)
    seen = set()  # photo.png and photo.jpg share photo.txt: read it once
    found = False
    for image in images:
        caption_file = texts.get(image.with_suffix(""))
        if caption_file is not None and caption_file not in seen:
            seen.add(caption_file)
            try:
                lines = read_caption_file(caption_file)[0]
                found = found or bool(lines)
                yield from lines
            except UnicodeDecodeError as error:
                raise CaptionEncodingError(
                    f"caption file {caption_file} is not UTF-8 text ({error.reason} at byte {error.start}): convert "
                    f"it, e.g. iconv -f latin1 -t utf-8 {caption_file} > tmp.txt && mv tmp.txt {caption_file}"
                ) from error
    if not found:  # indexing the folder says why none is usable (images without captions, no images, ...)
        TextImageFolder(root, warn=False)
