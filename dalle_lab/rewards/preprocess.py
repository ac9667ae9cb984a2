"""CLIP's image preprocessing written with torch ops, shared by the aesthetic scorer and the project's CLIP: shortest
side to the model's size with antialiased bicubic, centre crop, CLIP mean/std. It runs on batches of tensors on any
device and stays differentiable, so rewards can be backpropagated to the pixels.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

# OpenAI CLIP's normalisation constants (also HuggingFace CLIPImageProcessor's defaults).
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def clip_preprocess(images, image_size: int = 224, mean=CLIP_MEAN, std=CLIP_STD):
    """CLIP preprocessing on a batch of tensors: (B,3,H,W) in [0,1] -> (B,3,S,S) normalised, differentiable.

    Shortest side to `image_size` with antialiased bicubic (torch's antialias matches PIL's resampling), values
    clamped to [0,1] as an 8-bit image would be, centre crop, then CLIP mean/std.
    """
    if not torch.is_tensor(images) or images.dim() != 4 or images.shape[1] != 3:
        shape = tuple(images.shape) if hasattr(images, "shape") else type(images).__name__
        raise ValueError(f"expected images as a float tensor (B,3,H,W) in [0,1]; got {shape}")
    if not images.is_floating_point():
        images = images.float() / 255.0
    images = images.float()
    height, width = images.shape[-2:]
    if (height, width) != (image_size, image_size):
        scale = image_size / min(height, width)
        size = (max(image_size, int(height * scale)), max(image_size, int(width * scale)))
        images = F.interpolate(images, size=size, mode="bicubic", align_corners=False, antialias=True).clamp(0, 1)
        top = int(round((size[0] - image_size) / 2.0))
        left = int(round((size[1] - image_size) / 2.0))
        images = images[..., top:top + image_size, left:left + image_size]
    mean = torch.tensor(mean, dtype=images.dtype, device=images.device).view(1, 3, 1, 1)
    std = torch.tensor(std, dtype=images.dtype, device=images.device).view(1, 3, 1, 1)
    return (images - mean) / std


def preprocessor_settings(directory: Path) -> dict:
    """Mean/std from a transformers preprocessor_config.json when the model directory has one."""
    settings = {"mean": CLIP_MEAN, "std": CLIP_STD}
    config_path = directory / "preprocessor_config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text())
        settings["mean"] = tuple(config.get("image_mean", CLIP_MEAN))
        settings["std"] = tuple(config.get("image_std", CLIP_STD))
    return settings
