"""OpenAIDiscreteVAE: the discrete VAE OpenAI published with DALL-E (8192 codes, 256 px -> 32 x 32 tokens), read from
local copies of its encoder.pkl / decoder.pkl, as DALLE-pytorch used it. Nothing is downloaded.

Those files are whole pickled modules of OpenAI's `dall_e` package (`pip install DALL-E`), so reading them runs
pickle: only load files you trust. Images in [0, 1]; DALL-E's logit-Laplace pixel map (eps 0.1) on the way in, its
inverse on the way out, as there.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

KIND = "openai_discrete_vae"
_EPS = 0.1  # DALL-E's map_pixels / unmap_pixels margin
_HOW = ("OpenAIDiscreteVAE needs local copies of OpenAI's DALL-E encoder.pkl and decoder.pkl (nothing is "
        "downloaded here): OpenAIDiscreteVAE('encoder.pkl', 'decoder.pkl'), convert/generate with "
        "--openai_encoder_path/--openai_decoder_path, and `pip install DALL-E` for the classes they pickle")


class OpenAIDiscreteVAE(nn.Module):
    def __init__(self, encoder_path: str | os.PathLike | None = None, decoder_path: str | os.PathLike | None = None):
        super().__init__()
        if encoder_path is None or decoder_path is None:
            raise ValueError(_HOW)
        self.encoder_path, self.decoder_path = Path(encoder_path), Path(decoder_path)
        self.enc, self.dec = _load_pickled(self.encoder_path), _load_pickled(self.decoder_path)
        self.channels, self.num_layers, self.image_size, self.num_tokens = 3, 3, 256, 8192
        self.fmap_size = self.image_size // 2 ** self.num_layers
        self.image_seq_len = self.fmap_size ** 2
        self._sha256: str | None = None
        self.eval()
        self.requires_grad_(False)

    @property
    def identity(self) -> dict:
        if self._sha256 is None:
            from ..utils import file_sha256

            self._sha256 = file_sha256(self.encoder_path) + file_sha256(self.decoder_path)
        return {"kind": KIND, "encoder_path": str(self.encoder_path.resolve()),
                "decoder_path": str(self.decoder_path.resolve()), "sha256": self._sha256}

    def train(self, mode: bool = True):
        return super().train(False)  # frozen

    @torch.no_grad()
    def get_codebook_indices(self, images: torch.Tensor) -> torch.Tensor:
        logits = self.enc.blocks((1 - 2 * _EPS) * images + _EPS)
        return logits.argmax(dim=1).flatten(1)

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        side = int(tokens.shape[1] ** 0.5)
        one_hot = F.one_hot(tokens.view(-1, side, side), num_classes=self.num_tokens).permute(0, 3, 1, 2).float()
        stats = self.dec(one_hot).float()
        return ((torch.sigmoid(stats[:, :3]) - _EPS) / (1 - 2 * _EPS)).clamp(0, 1)


def _load_pickled(path: Path) -> nn.Module:
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist. {_HOW}")
    try:
        module = torch.load(path, map_location="cpu", weights_only=False)  # a pickled module: code, not just weights
    except ModuleNotFoundError as err:
        raise ValueError(f"{path} needs the package {err.name!r} to unpickle: `pip install DALL-E`") from err
    if not isinstance(module, nn.Module):
        raise ValueError(f"{path} holds a {type(module).__name__}, not a pickled module. {_HOW}")
    return module


def load_openai_vae(identity: dict, check_hash: bool = True) -> OpenAIDiscreteVAE:
    vae = OpenAIDiscreteVAE(identity["encoder_path"], identity["decoder_path"])
    if check_hash and identity.get("sha256") and vae.identity["sha256"] != identity["sha256"]:
        raise ValueError(f"OpenAI VAE files {identity['encoder_path']} / {identity['decoder_path']} are not the ones "
                         "the checkpoint recorded (sha256 differs): put the originals back")
    return vae
