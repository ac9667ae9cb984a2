"""A stand-in image tokenizer for Shapes that needs no network training: every p x p patch becomes the index of its
nearest patch in a k-means codebook fit on Shapes images (seconds of CPU), decoding puts the codebook patches back.

Why it exists: the study compares transformer settings, and a fixed image tokenizer is all it needs from the image
side. Flat-coloured Shapes images are almost exactly a mosaic of a few hundred 4x4 patches (PSNR ~29 dB, the Shapes
checker scores ~0.98 of attributes right on its reconstructions), so this tokenizer serves when the default
VQGAN (dalle_lab.vae.default_vae) is not trained yet. It has the VQGanVAE interface the training loop and the
generation helpers use (image_size, num_tokens, fmap_size, image_seq_len, identity, device,
get_codebook_indices, decode) and it is frozen.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

KIND = "patch_codebook"


class PatchCodebookTokenizer(nn.Module):
    def __init__(self, codebook: torch.Tensor, patch: int, image_size: int, path: str | os.PathLike | None = None):
        super().__init__()
        if image_size % patch:
            raise ValueError(f"image_size {image_size} is not a multiple of the patch side {patch}")
        if codebook.dim() != 2 or codebook.shape[1] != 3 * patch * patch:
            raise ValueError(f"codebook must be (num_tokens, 3 * {patch} * {patch}), got {tuple(codebook.shape)}")
        self.register_buffer("codebook", codebook.float().clone())
        self.patch, self.image_size = patch, image_size
        self.fmap_size = image_size // patch
        self.image_seq_len = self.fmap_size ** 2
        self.num_tokens = codebook.shape[0]
        self.path = Path(path) if path is not None else None
        self._sha256: str | None = None
        self.requires_grad_(False)
        self.eval()

    @property
    def device(self) -> torch.device:
        return self.codebook.device

    @property
    def identity(self) -> dict:
        from dalle_lab.utils import file_sha256

        if self.path is None:
            raise ValueError("this PatchCodebookTokenizer was built in memory; save() it so checkpoints can name it")
        if self._sha256 is None:  # every checkpoint asks; hash once
            self._sha256 = file_sha256(self.path)
        return {"kind": KIND, "model_path": str(self.path.resolve()), "sha256": self._sha256}

    def train(self, mode: bool = True):
        return super().train(False)  # frozen, like VQGanVAE

    def _patches(self, images: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> (B, N, 3 * p * p), patches in row-major grid order."""
        if images.dim() != 4 or images.shape[1] != 3 or images.shape[-1] != self.image_size \
                or images.shape[-2] != self.image_size:
            raise ValueError(f"images must be (B, 3, {self.image_size}, {self.image_size}) in [0, 1], got "
                             f"{tuple(images.shape)}")
        p = self.patch
        b = images.shape[0]
        grid = images.unfold(2, p, p).unfold(3, p, p)  # B, 3, g, g, p, p
        return grid.permute(0, 2, 3, 1, 4, 5).reshape(b, self.image_seq_len, 3 * p * p)

    @torch.no_grad()
    def get_codebook_indices(self, images: torch.Tensor) -> torch.LongTensor:
        patches = self._patches(images.to(self.device, torch.float32))
        distances = torch.cdist(patches.reshape(-1, patches.shape[-1]), self.codebook)
        return distances.argmin(dim=1).view(patches.shape[0], self.image_seq_len)

    @torch.no_grad()
    def decode(self, indices: torch.Tensor) -> torch.Tensor:
        p, g = self.patch, self.fmap_size
        patches = self.codebook[indices.to(self.device).long()]  # B, N, 3 p p
        images = patches.view(-1, g, g, 3, p, p).permute(0, 3, 1, 4, 2, 5).reshape(-1, 3, g * p, g * p)
        return images.clamp(0, 1)

    def save(self, path: str | os.PathLike) -> Path:
        from dalle_lab.utils import atomic_torch_save

        atomic_torch_save({"kind": KIND, "codebook": self.codebook.cpu(), "patch": self.patch,
                           "image_size": self.image_size}, path)
        self.path, self._sha256 = Path(path), None
        return self.path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PatchCodebookTokenizer":
        data = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(data, dict) or data.get("kind") != KIND:
            raise ValueError(f"{path} is not a patch-codebook tokenizer (write one with fit_patch_tokenizer)")
        return cls(data["codebook"], int(data["patch"]), int(data["image_size"]), path)


def fit_patch_tokenizer(path: str | os.PathLike, num_tokens: int = 512, patch: int = 4, image_size: int = 32,
                        n_images: int = 4000, iterations: int = 15, seed: int = 0) -> PatchCodebookTokenizer:
    """k-means (Lloyd's iterations) over the patches of n_images Shapes training images; saved to `path`.

    Initial centres are distinct patches chosen at random; a centre that loses all its patches is moved to the
    currently worst-reconstructed patch, so all num_tokens codes stay in use. Deterministic given the arguments.
    """
    from dalle_lab.data.shapes import ShapesDataset

    images, _ = ShapesDataset("train", length=n_images, image_size=image_size, seed=seed).batch(range(n_images))
    empty = PatchCodebookTokenizer(torch.zeros(1, 3 * patch * patch), patch, image_size)
    points = empty._patches(images).reshape(-1, 3 * patch * patch)
    distinct = torch.unique((points * 255).round(), dim=0) / 255
    if len(distinct) < num_tokens:
        raise ValueError(f"only {len(distinct)} distinct {patch}x{patch} patches in {n_images} images, fewer than "
                         f"num_tokens={num_tokens}: use more images or fewer tokens")
    generator = torch.Generator().manual_seed(seed)
    centres = distinct[torch.randperm(len(distinct), generator=generator)[:num_tokens]].clone()
    for _ in range(iterations):
        distances = torch.cdist(points, centres)
        nearest = distances.argmin(dim=1)
        counts = torch.bincount(nearest, minlength=num_tokens)
        sums = torch.zeros_like(centres).index_add_(0, nearest, points)
        used = counts > 0
        centres[used] = sums[used] / counts[used, None].float()
        dead = (~used).nonzero().flatten()
        if len(dead):
            errors = distances.gather(1, nearest[:, None]).squeeze(1)
            centres[dead] = points[errors.topk(len(dead)).indices]
    tokenizer = PatchCodebookTokenizer(centres, patch, image_size)
    tokenizer.save(path)
    return tokenizer


__all__ = ["PatchCodebookTokenizer", "fit_patch_tokenizer"]
