"""Image loading shared by the folder, shard and emoji datasets: RGB, resize + centre crop (or a random square
crop for folders, DALLE-pytorch's --random_resize_crop_lower_ratio), tensor in [0, 1]. torchvision is not a
dependency: the crops are PIL arithmetic."""
from __future__ import annotations

import numpy as np
import torch


def to_rgb(image, background=(255, 255, 255)):
    """A PIL image as RGB; transparent pixels are composited over `background` (transparent PNGs keep their look
    instead of showing whatever colour their invisible pixels happen to store), and 16-bit grayscale is scaled to
    8 bits (PIL's own conversion clips it, so nearly every pixel would come out white)."""
    from PIL import Image

    if image.mode.startswith("I"):  # I;16, I;16B, I;16L (16-bit PNG / TIFF) and I (16-bit values in 32 bits)
        levels = np.asarray(image, dtype=np.float64) / 257  # 65535 -> 255
        return Image.fromarray(np.rint(levels.clip(0, 255)).astype(np.uint8), "L").convert("RGB")
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


def random_square_crop(image, size: int, lower_ratio: float, rng):
    """A random square covering a fraction in [lower_ratio, 1] of the area of the image's largest square, at a
    random place, resized to `size`. For a square image this is torchvision's RandomResizedCrop(size,
    scale=(lower_ratio, 1), ratio=(1, 1)), which DALLE-pytorch used; for other shapes the fraction is of the largest
    square rather than of the whole image, so every draw fits and no retries are needed. rng: a random.Random."""
    from PIL import Image

    if not 0.0 < lower_ratio <= 1.0:
        raise ValueError(f"random_resize_crop_lower_ratio {lower_ratio} must be in (0, 1] (DALLE-pytorch used 0.75; "
                         "1 is the centre crop)")
    width, height = image.size
    side = max(1, round(min(width, height) * rng.uniform(lower_ratio, 1.0) ** 0.5))
    left, top = rng.randint(0, width - side), rng.randint(0, height - side)
    return image.resize((size, size), Image.BICUBIC, box=(left, top, left + side, top + side), reducing_gap=3.0)


def pil_to_tensor(image) -> torch.Tensor:
    """RGB PIL image -> (3, H, W) float tensor in [0, 1]."""
    array = np.asarray(image, dtype=np.uint8)
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float().div_(255)


def load_image(source, size: int, crop_lower_ratio: float = 1.0, rng=None) -> torch.Tensor:
    """Open (a path or a file object), convert, resize and crop an image: (3, size, size) float in [0, 1].
    crop_lower_ratio < 1: a random square crop drawn from rng (random_square_crop) instead of the centre crop.

    Raises whatever PIL raises for an unreadable file; callers report and skip it.
    """
    from PIL import Image

    with Image.open(source) as image:
        image.load()  # decode fully here, so a truncated file fails now and not later
        if crop_lower_ratio < 1.0:
            return pil_to_tensor(random_square_crop(to_rgb(image), size, crop_lower_ratio, rng))
        return pil_to_tensor(resize_center_crop(to_rgb(image), size))
