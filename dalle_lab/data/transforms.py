"""Image loading shared by the folder, shard and emoji datasets: RGB, resize + centre crop, tensor in [0, 1]."""
from __future__ import annotations

import numpy as np
import torch


def to_rgb(image, background=(255, 255, 255)):
    """A PIL image as RGB; transparent pixels are composited over `background` (transparent PNGs keep their look
    instead of showing whatever colour their invisible pixels happen to store)."""
    from PIL import Image

    if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        canvas = Image.new("RGBA", rgba.size, tuple(background) + (255,))
        return Image.alpha_composite(canvas, rgba).convert("RGB")
    return image.convert("RGB")


def resize_center_crop(image, size: int):
    """Scale the shorter side to `size` (antialiased), then crop the centre square."""
    from PIL import Image

    width, height = image.size
    scale = size / min(width, height)
    new_size = (max(size, round(width * scale)), max(size, round(height * scale)))
    if new_size != image.size:
        image = image.resize(new_size, Image.BICUBIC, reducing_gap=3.0)
    left = (new_size[0] - size) // 2
    top = (new_size[1] - size) // 2
    return image.crop((left, top, left + size, top + size))


def pil_to_tensor(image) -> torch.Tensor:
    """RGB PIL image -> (3, H, W) float tensor in [0, 1]."""
    array = np.asarray(image, dtype=np.uint8)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float().div_(255)


def load_image(source, size: int) -> torch.Tensor:
    """Open (a path or a file object), convert, resize and crop an image: (3, size, size) float in [0, 1].

    Raises whatever PIL raises for an unreadable file; callers report and skip it.
    """
    from PIL import Image

    with Image.open(source) as image:
        image.load()  # decode fully here, so a truncated file fails now and not later
        return pil_to_tensor(resize_center_crop(to_rgb(image), size))
