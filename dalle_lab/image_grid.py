"""Image grids: many images in one PNG, optionally with each image's caption underneath."""
from __future__ import annotations

import math
import os
from pathlib import Path

from PIL import Image, ImageDraw

from dalle_lab.utils import atomic_write


def to_uint8(images):
    """(B, 3, H, W) float tensor in [0, 1] -> (B, H, W, 3) uint8 numpy array."""
    return (images.detach().float().clamp(0, 1).mul(255).round().byte().permute(0, 2, 3, 1).cpu().numpy())


def _fit(text, width: int) -> str:
    """text cut to what fits in `width` pixels of the default bitmap font (about 6 px per character)."""
    text, max_chars = str(text), max(1, width // 6)
    return text if len(text) <= max_chars else text[: max_chars - 1] + "~"


def make_grid(images, nrow: int | None = None, padding: int = 2, captions=None, scale: int = 1,
              caption_height: int = 12):
    """A PIL image of `images` ((B, 3, H, W) in [0, 1]) in rows of `nrow`.

    `scale` enlarges tiny images (nearest neighbour, so token blocks stay visible); `captions` (one per image)
    are written under each tile, cut to the tile's width.
    """
    arrays = to_uint8(images)
    count = len(arrays)
    if count == 0:
        raise ValueError("make_grid needs at least one image")
    nrow = nrow or math.ceil(math.sqrt(count))
    rows = math.ceil(count / nrow)
    height, width = arrays.shape[1] * scale, arrays.shape[2] * scale
    text_h = caption_height if captions else 0
    canvas = Image.new("RGB", (nrow * (width + padding) + padding, rows * (height + text_h + padding) + padding),
                       "white")
    draw = ImageDraw.Draw(canvas)
    for i, array in enumerate(arrays):
        tile = Image.fromarray(array)
        if scale != 1:
            tile = tile.resize((width, height), Image.NEAREST)
        x = padding + (i % nrow) * (width + padding)
        y = padding + (i // nrow) * (height + text_h + padding)
        canvas.paste(tile, (x, y))
        if captions:
            draw.text((x, y + height), _fit(captions[i], width), fill="black")
    return canvas


def save_grid(images, path: str | os.PathLike, **kwargs) -> Path:
    """make_grid(...) saved as a PNG (written to a temporary name first, then renamed)."""
    grid = make_grid(images, **kwargs)
    return atomic_write(path, lambda tmp: grid.save(tmp, format="PNG"))


def make_labeled_rows(rows, scale: int = 2, padding: int = 2, label_width: int = 260):
    """A PIL image with one row per `(label, images (N, 3, H, W) in [0, 1])`: the label at the left, then the
    images. For comparisons such as "the real drawing, then eight samples" per caption."""
    if not rows:
        raise ValueError("make_labeled_rows needs at least one row")
    tiles = [to_uint8(images) for _, images in rows]
    height, width = tiles[0].shape[1] * scale, tiles[0].shape[2] * scale
    columns = max(len(t) for t in tiles)
    canvas = Image.new("RGB", (label_width + columns * (width + padding) + padding,
                               len(rows) * (height + padding) + padding), "white")
    draw = ImageDraw.Draw(canvas)
    for r, ((label, _), arrays) in enumerate(zip(rows, tiles)):
        y = padding + r * (height + padding)
        draw.text((padding, y + height // 2 - 5), _fit(label, label_width), fill="black")
        for c, array in enumerate(arrays):
            tile = Image.fromarray(array).resize((width, height), Image.NEAREST)
            canvas.paste(tile, (label_width + padding + c * (width + padding), y))
    return canvas
