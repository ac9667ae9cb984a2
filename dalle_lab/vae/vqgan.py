"""VQGanVAE: a frozen taming-transformers VQGAN as the image tokenizer of a DALLE (pixels <-> token ids).

Images cross this boundary in [0, 1] (the package convention); taming works in [-1, 1], so the conversion lives
here and nowhere else.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

from . import taming_format
from .shipped import shipped_with_hash

KIND = "taming_vqgan"


# The two functions below are the only place pixels and taming's latents meet; training validation uses them too.
def encode_to_indices(model, images: torch.Tensor, is_gumbel: bool) -> torch.Tensor:
    """(B, 3, H, W) images in [0, 1] -> (B, h*w) code ids, row-major, through a taming VQModel/GumbelVQ."""
    h = model.quant_conv(model.encoder(images * 2 - 1))  # taming works in [-1, 1]
    if is_gumbel:
        # taming's GumbelQuantize adds Gumbel noise even in eval mode; a tokenizer must be deterministic, so
        # take the most likely code (the noise-free argmax of the same logits).
        indices = model.quantize.proj(h).argmax(dim=1)
    else:
        _, _, (_, _, indices) = model.quantize(h)
    return indices.reshape(images.shape[0], -1).long()


def decode_latents(model, z: torch.Tensor, fmap_size: int) -> torch.Tensor:
    """(B, fmap_size**2, embed_dim) codebook vectors -> (B, 3, H, W) images in [0, 1]."""
    b, _, d = z.shape
    z = z.transpose(1, 2).reshape(b, d, fmap_size, fmap_size)
    return ((model.decode(z) + 1) / 2).clamp(0, 1)


def codebook_of(model) -> torch.Tensor:
    """(n_embed, embed_dim) codebook of a taming model (VectorQuantizer2 and GumbelQuantize name it differently)."""
    quantize = model.quantize
    return quantize.embed.weight if hasattr(quantize, "embed") else quantize.embedding.weight


class VQGanVAE(nn.Module):
    """A taming VQModel or GumbelVQ loaded from local `vqgan_model_path` (.ckpt) + `vqgan_config_path` (.yaml).

    Attributes: image_size (from the config's ddconfig.resolution), num_tokens (codebook size), fmap_size (token
    grid side), image_seq_len, identity. Frozen: always in eval mode, no parameter requires grad.
    """

    def __init__(self, vqgan_model_path: str | os.PathLike | None = None,
                 vqgan_config_path: str | os.PathLike | None = None, trust_pickle: bool = False):
        super().__init__()
        if vqgan_model_path is None or vqgan_config_path is None:
            # DALLE-pytorch downloaded its ImageNet VQGAN here; nothing is downloaded in dalle_lab
            raise ValueError("VQGanVAE needs local files: VQGanVAE(vqgan_model_path='model.ckpt', "
                             "vqgan_config_path='model.yaml') (a taming-transformers checkpoint and its config; "
                             "nothing is downloaded, and dalle_lab.default_vae() is the shipped Shapes VQGAN)")
        self.model_path = Path(vqgan_model_path)
        self.config_path = Path(vqgan_config_path)
        model_config = taming_format.read_model_config(self.config_path)
        state_dict = taming_format.read_state_dict(self.model_path, trust_pickle=trust_pickle)
        self.model = taming_format.build_model(model_config)
        taming_format.load_weights_strictly(self.model, state_dict, self.model_path, self.config_path)

        self.is_gumbel = model_config["target"].endswith("GumbelVQ")
        ddconfig = model_config["params"]["ddconfig"]
        self.image_size = int(ddconfig["resolution"])
        self.fmap_size = taming_format.fmap_size(ddconfig)
        self.image_seq_len = self.fmap_size**2
        self.num_tokens = int(model_config["params"]["n_embed"])
        self._sha256: str | None = None

        self.eval()
        self.requires_grad_(False)

    # -- identity ---------------------------------------------------------------------------------------------
    @property
    def identity(self) -> dict[str, Any]:
        """What a DALLE checkpoint records instead of the VAE weights (see load_vae)."""
        if self._sha256 is None:  # hashing a published 1 GB checkpoint takes seconds: do it once, when asked
            from ..utils import file_sha256

            self._sha256 = file_sha256(self.model_path)
        return {
            "kind": KIND,
            "model_path": str(self.model_path.resolve()),
            "config_path": str(self.config_path.resolve()),
            "sha256": self._sha256,
        }

    def train(self, mode: bool = True):
        """The tokenizer is frozen: a parent module's .train() leaves it in eval mode."""
        return super().train(False)

    @property
    def codebook(self) -> torch.Tensor:
        """(num_tokens, embed_dim) codebook vectors (taming names them differently per quantizer)."""
        return codebook_of(self.model)

    @property
    def device(self) -> torch.device:
        return self.codebook.device

    # -- pixels -> tokens -------------------------------------------------------------------------------------
    def _check_images(self, images: torch.Tensor) -> None:
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be (batch, 3, height, width); got shape {tuple(images.shape)}")
        if images.shape[-2:] != (self.image_size, self.image_size):
            raise ValueError(
                f"this VQGAN ({self.config_path}) takes {self.image_size}x{self.image_size} images; got "
                f"{images.shape[-2]}x{images.shape[-1]}: resize/crop them first"
            )
        low, high = float(images.min()), float(images.max())
        if low < -0.05 or high > 1.05:
            raise ValueError(
                f"images must be in [0, 1]; got values in [{low:.3f}, {high:.3f}] (images in [-1, 1]? use (x + 1) / 2)"
            )

    @torch.no_grad()
    def get_codebook_indices(self, images: torch.Tensor) -> torch.LongTensor:
        """(B, 3, H, W) images in [0, 1] -> (B, fmap_size**2) token ids, row-major over the token grid."""
        self._check_images(images)
        return encode_to_indices(self.model, images.to(self.device, self.codebook.dtype), self.is_gumbel)

    # -- tokens -> pixels -------------------------------------------------------------------------------------
    def _decode_latents(self, z: torch.Tensor) -> torch.Tensor:
        """(B, fmap_size**2, embed_dim) quantized latents -> (B, 3, H, W) images in [0, 1]."""
        if z.shape[1] != self.image_seq_len:
            raise ValueError(f"expected {self.image_seq_len} image tokens per image, got {z.shape[1]}")
        return decode_latents(self.model, z, self.fmap_size)

    @torch.no_grad()
    def decode(self, indices: torch.Tensor) -> torch.Tensor:
        """(B, fmap_size**2) token ids -> (B, 3, H, W) images in [0, 1]."""
        if indices.ndim != 2:
            raise ValueError(f"indices must be (batch, {self.image_seq_len}); got shape {tuple(indices.shape)}")
        if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= self.num_tokens):
            raise ValueError(
                f"image token ids must be in [0, {self.num_tokens}); got [{int(indices.min())}, {int(indices.max())}]"
            )
        return self._decode_latents(self.codebook[indices.to(self.device).long()])

    def decode_soft(self, probs: torch.Tensor) -> torch.Tensor:
        """(B, N, num_tokens) distributions over codes -> images of their expected codebook vectors.

        Differentiable with respect to `probs` (the VAE's own weights stay frozen): reward backpropagation uses
        it to push pixel-space gradients into the transformer's logits. One-hot probs give exactly decode().
        """
        if probs.ndim != 3 or probs.shape[-1] != self.num_tokens:
            raise ValueError(f"probs must be (batch, {self.image_seq_len}, {self.num_tokens}); got {tuple(probs.shape)}")
        return self._decode_latents(probs.to(self.codebook.dtype) @ self.codebook)


def load_vae(identity_or_paths: Mapping[str, Any] | tuple | list, check_hash: bool = True) -> VQGanVAE:
    """Rebuild the VQGanVAE a checkpoint recorded (its `identity` dict), checking the checkpoint's hash.

    Also accepts `(model_path, config_path)`. A moved file can be pointed at by editing the identity's paths;
    a different file under the same path is refused (the transformer's tokens would mean something else).
    """
    if isinstance(identity_or_paths, (tuple, list)):
        model_path, config_path = identity_or_paths
        return VQGanVAE(model_path, config_path)
    identity = dict(identity_or_paths)
    if identity.get("kind") != KIND:
        raise ValueError(f"not a VQGAN identity (kind {identity.get('kind')!r}, expected {KIND!r}): {identity}")
    model_path, config_path = identity["model_path"], identity["config_path"]
    if not Path(model_path).is_file() and identity.get("sha256"):
        # A checkpoint made elsewhere records that machine's path; a shipped default tokenizer is found by hash.
        model_path, config_path = shipped_with_hash(identity["sha256"]) or (model_path, config_path)
    vae = VQGanVAE(model_path, config_path)
    if check_hash and identity.get("sha256") and vae.identity["sha256"] != identity["sha256"]:
        raise ValueError(
            f"VQGAN checkpoint {model_path} has sha256 {vae.identity['sha256'][:12]}..., but the "
            f"checkpoint being loaded was trained with {identity['sha256'][:12]}...: it is a different image "
            "tokenizer. Put the original file back at that path (or pass check_hash=False if you know better)."
        )
    return vae
