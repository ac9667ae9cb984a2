"""DALLE-pytorch's two position tricks, `rotary_emb` and `shift_tokens`, written for any set of positions so the
full pass, the growing KV cache, the static cache and speculative windows all compute the same thing.

Sequence layout (dalle.py): positions 0..T are BOS and the text (text_len = T + 1), position text_len + i is image
token i at grid cell (i // fmap, i % fmap).

Rotary (Su et al. 2021): each query and key has pairs of its features rotated by angles proportional to a
coordinate, so q.k depends on coordinate differences. As in DALLE-pytorch the rotated features form three bands
of dim_head // 3 (rounded down to even; the rest pass unrotated):
- band 1, the text position: text tokens at their position p, every image token at text_len (one step past the
  text, so it encodes no order among image tokens);
- bands 2 and 3, the image row and column: image tokens at their row and column, text tokens at -1 (just outside
  the grid). So image tokens see their 2-D offsets to each other, text tokens their 1-D order.
DALLE-pytorch put the image at text position 8192 and the text at -10 on a [-1, 1] pixel axis with "pixel"
frequencies; this uses integer coordinates and one frequency ladder (base 10000) for all three bands, which keeps
the same structure (1-D text, 2-D image) with integer coordinates that need no rescaling for other grid sizes.
DALLEConfig.rotary_style="dallepytorch" computes DALLE-pytorch's angles exactly (models converted from it), and then
the attention also rotates the values, as DALLE-pytorch did.

Token shift (Peng's RWKV trick as DALLE-pytorch used it): before attention and before the feed-forward (after
their LayerNorm), a text token takes the first half of its features from the previous token; an image token takes
the first quarter from the cell above and the second quarter from the cell to its left (zeros on the top row / left
column and for BOS). Cached decoding keeps each layer's normalised inputs (ShiftHistory) so a new token can read
its neighbours, including earlier tokens of the same speculative window.
"""
from __future__ import annotations

import math

import torch

ROTARY_BASE = 10000.0


def rotary_band(dim_head: int) -> int:
    """Features per rotary band (three bands): dim_head // 3, rounded down to even."""
    band = (dim_head // 3) // 2 * 2
    if band < 2:
        raise ValueError(f"rotary_emb needs dim_head >= 6 (three bands of at least 2 features), got {dim_head}")
    return band


def rotary_angles(positions: torch.Tensor, text_len: int, fmap: int, dim_head: int, style: str = "dalle_lab"):
    """(cos, sin) for queries/keys at positions (n,) or (B, n): shapes (1, 1, n, 3*band/2) or (B, 1, n, ...).

    style "dallepytorch" gives DALLE-pytorch 1.6.6's angles instead (see _dallepytorch_angles);
    "dallepytorch_fp16" / "dallepytorch_bf16" those angles rounded to that dtype, as its half-precision files hold
    them (model/config.py, ROTARY_STYLES)."""
    band = rotary_band(dim_head)
    cell = positions - text_len
    image = cell >= 0
    cell = cell.clamp(0, fmap * fmap - 1)  # positions past the grid (speculative slack) are never used
    row, col = torch.div(cell, fmap, rounding_mode="floor"), cell % fmap
    if style.startswith("dallepytorch"):
        angles = _dallepytorch_angles(positions, image, row, col, text_len, fmap, dim_head)
        stored = {"dallepytorch_fp16": torch.float16, "dallepytorch_bf16": torch.bfloat16}.get(style)
        if stored is not None:  # the angles as a --fp16 / bf16 file holds them, which its model computed with
            angles = angles.to(stored).float()
    else:
        text_coord = torch.where(image, torch.full_like(positions, text_len), positions)
        row = torch.where(image, row, torch.full_like(positions, -1))
        col = torch.where(image, col, torch.full_like(positions, -1))
        coords = torch.stack([text_coord, row, col], dim=-1).float()  # (..., n, 3)
        inv_freq = ROTARY_BASE ** (-torch.arange(0, band, 2, device=positions.device, dtype=torch.float32) / band)
        angles = (coords.unsqueeze(-1) * inv_freq).flatten(-2)  # (..., n, 3 * band / 2)
    angles = angles.unsqueeze(-3)  # a head axis
    if angles.dim() == 3:
        angles = angles.unsqueeze(0)
    return angles.cos(), angles.sin()


# DALLE-pytorch 1.6.6 (rotary-embedding-torch 0.1.5) places the image at text position 8192 and the text at -10 on
# the image's [-1, 1] row/column axes, with "pixel" frequencies pi * linspace(1, 5) for the image bands.
_DP_IMAGE_TEXT_POSITION = 8192.0
_DP_TEXT_PIXEL_POSITION = -10.0
_DP_MAX_PIXEL_FREQ = 10.0


def _dallepytorch_angles(positions, image, row, col, text_len, fmap, dim_head):
    """DALLE-pytorch's rotary angles, the same float32 products it forms: its bands have dim_head // 3 features
    (rounded down to pairs) but its text frequencies divide by the unrounded dim_head // 3."""
    rot_dim = dim_head // 3
    pairs = rot_dim // 2
    device = positions.device
    text_freq = 1.0 / (ROTARY_BASE ** (torch.arange(0, rot_dim, 2, device=device)[:pairs].float() / rot_dim))
    pixel_freq = torch.linspace(1.0, _DP_MAX_PIXEL_FREQ / 2, pairs, device=device) * math.pi
    axis = torch.linspace(-1, 1, steps=fmap, device=device)  # image rows and columns on [-1, 1]
    text_coord = torch.where(image, _DP_IMAGE_TEXT_POSITION, positions.float())
    outside = torch.full_like(text_coord, _DP_TEXT_PIXEL_POSITION)
    row_coord = torch.where(image, axis[row], outside)
    col_coord = torch.where(image, axis[col], outside)
    return torch.cat([text_coord.unsqueeze(-1) * text_freq, row_coord.unsqueeze(-1) * pixel_freq,
                      col_coord.unsqueeze(-1) * pixel_freq], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate consecutive feature pairs of x (B, heads, n, dim_head) by the angles; features past the bands pass."""
    rot = 2 * cos.shape[-1]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # bf16 queries stay bf16 (SDPA needs matching dtypes)
    pairs = x[..., :rot].unflatten(-1, (-1, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    return torch.cat([rotated, x[..., rot:]], dim=-1)


class ShiftHistory:
    """One layer's normalised branch inputs at every position written so far (B, max_len, dim), for token shift in
    cached decoding. Zeros where nothing was written, so reading a masked neighbour is harmless."""

    def __init__(self, max_len: int):
        self.max_len, self.buffer = max_len, None

    def update(self, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.buffer is None:
            self.buffer = h.new_zeros(h.shape[0], self.max_len, h.shape[-1])
        if positions.dim() == 1:
            self.buffer[:, positions] = h.to(self.buffer.dtype)
        else:  # each row at its own positions (static cache)
            self.buffer.scatter_(1, positions.unsqueeze(-1).expand(-1, -1, h.shape[-1]), h.to(self.buffer.dtype))
        return self.buffer


class TokenShift:
    """Token shift for one transformer pass over the tokens at `positions` ((n,) shared or (B, n) per row)."""

    def __init__(self, positions: torch.Tensor, text_len: int, fmap: int):
        self.positions, self.text_len, self.fmap = positions, text_len, fmap
        cell = positions - text_len
        self.image = (cell >= 0).unsqueeze(-1)
        # left: the previous text token, or the image cell to the left (none in column 0, none before BOS)
        self.left_ok = torch.where(cell >= 0, cell % fmap > 0, positions > 0).unsqueeze(-1)
        self.top_ok = (cell >= fmap).unsqueeze(-1)

    def __call__(self, h: torch.Tensor, cache=None, name: str = "") -> torch.Tensor:
        """h (B, n, dim): a branch's normalised input. cache: the layer's KV cache (its `side` dict keeps the
        history under `name`); without one, h must hold the whole sequence from position 0."""
        if cache is None:
            source = h
        else:
            history = cache.side.get(name)
            if history is None:
                history = cache.side[name] = ShiftHistory(cache.max_len)
            source = history.update(h, self.positions)
        left = torch.where(self.left_ok, self._read(source, self.positions - 1), 0.0)
        top = torch.where(self.top_ok, self._read(source, self.positions - self.fmap), 0.0)
        d = h.shape[-1]
        # sized as torch.chunk sizes them (DALLE-pytorch's split): rounded up where dim is not a multiple of 4
        half, quarter = -(-d // 2), -(-d // 4)
        text = torch.cat([left[..., :half], h[..., half:]], dim=-1)
        image = torch.cat([top[..., :quarter], left[..., quarter:2 * quarter], h[..., 2 * quarter:]], dim=-1)
        return torch.where(self.image, image, text).to(h.dtype)

    @staticmethod
    def _read(source: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        positions = positions.clamp(min=0)
        if positions.dim() == 1:
            return source[:, positions]
        return source.gather(1, positions.unsqueeze(-1).expand(-1, -1, source.shape[-1]))
