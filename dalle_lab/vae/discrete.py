"""DiscreteVAE: DALLE-pytorch's discrete VAE (a Gumbel-softmax autoencoder over a learned codebook), so its trained
weights load here unchanged and its training code runs with only the import changed.

    vae = DiscreteVAE(image_size=256, num_layers=3, num_tokens=8192, codebook_dim=512, hidden_dim=64)
    loss = vae(images, return_loss=True); loss.backward()       # images (B, C, H, W) in [0, 1]
    tokens = vae.get_codebook_indices(images)                    # (B, fmap_size ** 2)
    recon = vae.decode(tokens)                                    # in the normalised space, as DALLE-pytorch

The module names (encoder / decoder / codebook and their indices) are DALLE-pytorch 1.6.6's, so a state dict it
saved loads with `load_state_dict`. `decode` returns the decoder's raw output as there (images normalised by
`normalization`, about [-1, 1]); `decode_images` maps it back to [0, 1], the convention of the rest of dalle_lab, and
is what a DALLE's generate_images returns. Files: DALLE-pytorch's train_vae.py format, {"hparams", "weights"}
(`load_discrete_vae`, `DiscreteVAE.save`); a DALLE checkpoint records the file's path and hash, not the weights.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

KIND = "dallepytorch_discrete_vae"
# DALLE-pytorch's default: RGB(A) channels mapped from [0, 1] to [-1, 1] (alpha left as it is)
DEFAULT_NORMALIZATION = ((0.5, 0.5, 0.5, 0.0), (0.5, 0.5, 0.5, 1.0))


class ResBlock(nn.Module):
    """conv3x3 - relu - conv3x3 - relu - conv1x1, added to its input (DALLE-pytorch's layout, `net.0/2/4`)."""

    def __init__(self, channels: int):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(channels, channels, 1))

    def forward(self, x):
        return x + self.net(x)


def _down(c_in, c_out):
    return nn.Sequential(nn.Conv2d(c_in, c_out, 4, stride=2, padding=1), nn.ReLU())


def _up(c_in, c_out):
    return nn.Sequential(nn.ConvTranspose2d(c_in, c_out, 4, stride=2, padding=1), nn.ReLU())


class DiscreteVAE(nn.Module):
    def __init__(self, image_size: int = 256, num_tokens: int = 512, codebook_dim: int = 512, num_layers: int = 3,
                 num_resnet_blocks: int = 0, hidden_dim: int = 64, channels: int = 3, smooth_l1_loss: bool = False,
                 temperature: float = 0.9, straight_through: bool = False, reinmax: bool = False,
                 kl_div_loss_weight: float = 0.0, normalization=DEFAULT_NORMALIZATION):
        super().__init__()
        if image_size < 1 or not math.log2(image_size).is_integer():
            raise ValueError(f"DiscreteVAE image_size must be a power of 2, got {image_size}")
        if num_layers < 1 or image_size % 2 ** num_layers:
            raise ValueError(f"DiscreteVAE num_layers={num_layers}: each layer halves the image, so it must be >= 1 "
                             f"and image_size ({image_size}) divisible by 2 ** num_layers")
        self.image_size, self.num_tokens, self.num_layers, self.channels = image_size, num_tokens, num_layers, channels
        self.temperature, self.straight_through, self.reinmax = temperature, straight_through, reinmax
        self.kl_div_loss_weight = kl_div_loss_weight
        self.smooth_l1_loss = smooth_l1_loss
        self.normalization = None if normalization is None else tuple(tuple(t)[:channels] for t in normalization)
        self.fmap_size = image_size // 2 ** num_layers
        self.image_seq_len = self.fmap_size ** 2
        self.path: Path | None = None  # the file it was loaded from (load_discrete_vae), for `identity`
        self._sha256: str | None = None

        self.codebook = nn.Embedding(num_tokens, codebook_dim)
        # Encoder: num_layers stride-2 convs, then the residual blocks, then 1x1 to token logits. Decoder: mirrored,
        # with a 1x1 from the codebook width first when there are residual blocks (DALLE-pytorch's layout).
        hidden = [hidden_dim] * num_layers
        encoder = [_down(c_in, c_out) for c_in, c_out in zip([channels] + hidden[:-1], hidden)]
        encoder += [ResBlock(hidden_dim) for _ in range(num_resnet_blocks)]
        encoder.append(nn.Conv2d(hidden_dim, num_tokens, 1))
        decoder_in = hidden_dim if num_resnet_blocks else codebook_dim
        decoder = [nn.Conv2d(codebook_dim, hidden_dim, 1)] if num_resnet_blocks else []
        decoder += [ResBlock(hidden_dim) for _ in range(num_resnet_blocks)]
        decoder += [_up(c_in, c_out) for c_in, c_out in zip([decoder_in] + hidden[:-1], hidden)]
        decoder.append(nn.Conv2d(hidden_dim, channels, 1))
        self.encoder, self.decoder = nn.Sequential(*encoder), nn.Sequential(*decoder)

    # ----- identity and files ----------------------------------------------------------------------------------

    @property
    def identity(self) -> dict:
        """What a DALLE checkpoint records instead of the weights: the file's path and hash (save or load first)."""
        if self.path is None:
            raise ValueError("this DiscreteVAE was built in memory: save it first (vae.save('vae.pt')) so a DALLE "
                             "checkpoint can record which file it was trained with")
        if self._sha256 is None:
            from ..utils import file_sha256

            self._sha256 = file_sha256(self.path)
        return {"kind": KIND, "path": str(self.path.resolve()), "sha256": self._sha256}

    def hparams(self) -> dict:
        """Every constructor argument (`load_discrete_vae` reads them back): the shapes DALLE-pytorch's train_vae.py
        records, and the settings encoding (normalization) and training (the rest) depend on, which it took from
        its command line instead."""
        return dict(image_size=self.image_size, num_layers=self.num_layers, num_tokens=self.num_tokens,
                    channels=self.channels, codebook_dim=self.codebook.embedding_dim,
                    hidden_dim=self.encoder[0][0].out_channels,
                    num_resnet_blocks=sum(isinstance(m, ResBlock) for m in self.encoder),
                    normalization=self.normalization, temperature=self.temperature,
                    straight_through=self.straight_through, reinmax=self.reinmax,
                    kl_div_loss_weight=self.kl_div_loss_weight, smooth_l1_loss=self.smooth_l1_loss)

    def save(self, path: str | os.PathLike) -> Path:
        """Write DALLE-pytorch's VAE file ({"hparams", "weights"}), atomically; the vae then records this file."""
        from ..utils import atomic_torch_save

        path = atomic_torch_save({"hparams": self.hparams(), "weights": self.state_dict()}, path)
        self.path, self._sha256 = Path(path), None
        return self.path

    @property
    def device(self) -> torch.device:
        return self.codebook.weight.device

    # ----- pixels <-> tokens -----------------------------------------------------------------------------------

    def norm(self, images: torch.Tensor) -> torch.Tensor:
        if self.normalization is None:
            return images
        means, stds = (torch.as_tensor(t).to(images).view(1, -1, 1, 1) for t in self.normalization)
        return (images - means) / stds

    def _check(self, images: torch.Tensor) -> None:
        if images.dim() != 4 or tuple(images.shape[1:]) != (self.channels, self.image_size, self.image_size):
            raise ValueError(f"this DiscreteVAE takes images (batch, {self.channels}, {self.image_size}, "
                             f"{self.image_size}), got {tuple(images.shape)}: resize/crop them first")

    @torch.no_grad()
    def get_codebook_indices(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) in [0, 1] -> (B, fmap_size ** 2) ids: the most likely code of each cell (no sampling)."""
        self._check(images)
        was_training = self.training
        self.eval()
        try:
            return self.encoder(self.norm(images)).argmax(dim=1).flatten(1)
        finally:
            self.train(was_training)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, n) ids -> the decoder's output (B, C, H, W), in the normalised space (as DALLE-pytorch's decode)."""
        side = math.isqrt(tokens.shape[1])
        if side * side != tokens.shape[1]:
            raise ValueError(f"{tokens.shape[1]} image tokens do not form a square grid")
        z = self.codebook(tokens).view(tokens.shape[0], side, side, -1).permute(0, 3, 1, 2)
        return self.decoder(z)

    def decode_images(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, n) ids -> images in [0, 1]: decode, undo the normalisation, clamp."""
        return self._to_unit(self.decode(tokens))

    def decode_soft(self, probs: torch.Tensor) -> torch.Tensor:
        """(B, n, num_tokens) distributions over codes -> images in [0, 1] of their expected codebook vectors
        (differentiable in probs; reward backpropagation uses it). One-hot probs give decode_images."""
        side = math.isqrt(probs.shape[1])
        z = (probs.to(self.codebook.weight.dtype) @ self.codebook.weight).view(probs.shape[0], side, side, -1)
        return self._to_unit(self.decoder(z.permute(0, 3, 1, 2)))

    def _to_unit(self, out: torch.Tensor) -> torch.Tensor:
        if self.normalization is not None:
            means, stds = (torch.as_tensor(t).to(out).view(1, -1, 1, 1) for t in self.normalization)
            out = out * stds + means
        return out.clamp(0, 1)

    # ----- training --------------------------------------------------------------------------------------------

    def forward(self, img: torch.Tensor, return_loss: bool = False, return_recons: bool = False,
                return_logits: bool = False, temp: float | None = None):
        """Reconstruct img (B, C, H, W) in [0, 1] through Gumbel-softmax codes. return_logits: the encoder's
        (B, num_tokens, h, w) logits. return_loss: reconstruction loss (MSE, or smooth L1) + kl_div_loss_weight *
        KL(codes || uniform), and with return_recons also the reconstruction."""
        self._check(img)
        img = self.norm(img)
        logits = self.encoder(img)
        if return_logits:
            return logits
        temp = self.temperature if temp is None else temp
        soft = F.gumbel_softmax(logits, tau=temp, dim=1, hard=self.straight_through)
        if self.straight_through and self.reinmax:
            soft = _reinmax(soft, logits, temp)
        out = self.decoder(torch.einsum("bnhw,nd->bdhw", soft, self.codebook.weight))
        if not return_loss:
            return out
        recon = (F.smooth_l1_loss if self.smooth_l1_loss else F.mse_loss)(img, out)
        log_q = F.log_softmax(logits.flatten(2).transpose(1, 2), dim=-1)  # (B, cells, tokens)
        log_uniform = torch.full((1,), -math.log(self.num_tokens), device=img.device)
        kl = F.kl_div(log_uniform, log_q, reduction="batchmean", log_target=True)
        loss = recon + kl * self.kl_div_loss_weight
        return (loss, out) if return_recons else loss


def _reinmax(hard: torch.Tensor, logits: torch.Tensor, temp: float) -> torch.Tensor:
    """ReinMax (Liu et al. 2023, algorithm 2): a second-order straight-through gradient for the hard codes."""
    hard = hard.detach()
    pi0 = logits.softmax(dim=1)
    pi1 = (hard + (logits / temp).softmax(dim=1)) / 2
    pi1 = ((pi1.clamp_min(1e-20).log() - logits).detach() + logits).softmax(dim=1)
    pi2 = 2 * pi1 - 0.5 * pi0
    return pi2 - pi2.detach() + hard


def load_discrete_vae(path: str | os.PathLike, sha256: str | None = None) -> DiscreteVAE:
    """A DiscreteVAE from DALLE-pytorch's VAE file ({"hparams", "weights"}); sha256: refuse another file."""
    from ..utils import file_sha256

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"DiscreteVAE file {path} does not exist: pass the .pt file DALLE-pytorch's "
                                "train_vae.py (or `python -m dalle_lab.convert`) wrote")
    if sha256 is not None and file_sha256(path) != sha256:
        raise ValueError(f"DiscreteVAE file {path} is not the one the checkpoint recorded (sha256 "
                         f"{file_sha256(path)[:12]}... here, {sha256[:12]}... recorded): put the original back")
    saved = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(saved, dict) or "hparams" not in saved or "weights" not in saved:
        raise ValueError(f"{path} is not a DiscreteVAE file: it needs the keys 'hparams' and 'weights' "
                         "(DALLE-pytorch's train_vae.py format)")
    vae = DiscreteVAE(**saved["hparams"])
    vae.load_state_dict(saved["weights"])
    vae.path = path
    return vae
