"""Which of an image's tokens its reward is credited to, for the policy gradient.

A policy gradient that gives every token of an image the image's advantage pays, per update, one noise term per
token. On the built-in Shapes data most of an image is plain background, and the VQGAN draws a plain background
cell with several near-equivalent codes: on the float32 demo model, 75 % of the tokens sampled with the
faithfulness preset are background cells, at 0.92 nats of sampling entropy each against 2.13 on content cells, 56 %
of all the sampled entropy (`python -m lab.studies.align.token_credit` -> lab/studies/align/results/token_credit_entropy.json).
Which of those codes was drawn does not change the reward, so their share of the gradient is noise.

Measured, it is not the noise that matters: the gradients of two independent 128-image epochs are as unrelated with
content credit as without (cosine about 0.01 either way, `lab/studies/align/gradient_noise.py`); the sampled content
cells, at 2.1 nats each, carry most of the score-function noise themselves. The option stays for rewards whose
signal sits in few cells of a plain background.

`content` credit gives the advantage only to tokens whose cell shows something other than the background (the
median colour of the image's border, as the Shapes checker reads it); the background cells still feel the KL
penalty, which holds them to the starting model. An image with no such cell (nothing drawn) keeps uniform credit, so
drawing nothing is still penalised. On photographs almost every cell differs from the border's median, and
`content` credit becomes the uniform one.
"""
from __future__ import annotations

import torch

from dalle_lab.align.config import CREDITS
# A cell counts as content when some pixel differs from the background by more than this in a channel (images in
# [0, 1]). Decoded background cells of the Shapes VQGAN stay below 0.05; object cells, edges included, above 0.1.
CONTENT_THRESHOLD = 0.1


def background_colour(images: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) images -> (B, 3): the per-channel median of the border pixels."""
    border = torch.cat([images[:, :, 0], images[:, :, -1], images[:, :, 1:-1, 0], images[:, :, 1:-1, -1]], dim=-1)
    return border.median(dim=-1).values


def content_cells(images: torch.Tensor, grid: int, threshold: float = CONTENT_THRESHOLD) -> torch.Tensor:
    """(B, grid * grid) bool in raster (token) order: cells where some pixel differs from the background colour by
    more than `threshold` in some channel."""
    b, _, h, w = images.shape
    if h % grid or w % grid:
        raise ValueError(f"images of {h}x{w} pixels do not split into a {grid}x{grid} token grid")
    deviation = (images.float() - background_colour(images.float())[:, :, None, None]).abs().amax(dim=1)
    cells = deviation.reshape(b, grid, h // grid, grid, w // grid).amax(dim=(2, 4))
    return (cells > threshold).reshape(b, grid * grid)


def token_credit(images: torch.Tensor, num_tokens: int, kind: str) -> torch.Tensor:
    """(B, num_tokens) float weights of each token's share of its image's advantage: 1 everywhere ("uniform"), or 1
    on content cells and 0 on background cells ("content"; all 1 for an image without content)."""
    if kind not in CREDITS:
        raise ValueError(f"token credit must be one of {', '.join(CREDITS)}, not {kind!r}")
    ones = torch.ones(images.shape[0], num_tokens, device=images.device)
    if kind == "uniform":
        return ones
    grid = int(round(num_tokens ** 0.5))
    if grid * grid != num_tokens:
        raise ValueError(f"content credit needs a square token grid, got {num_tokens} image tokens")
    content = content_cells(images, grid).float()
    empty = content.sum(dim=1, keepdim=True) == 0
    return torch.where(empty, ones, content)
