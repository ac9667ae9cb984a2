"""DALLE-pytorch's sparse attention types as boolean masks over the image grid.

DALLE-pytorch implemented `axial_row`, `axial_col` and `conv_like` as separate attention classes that reshaped the
keys into rows, columns or unfolded windows. Here each type is only a rule saying which key position a query
position may see; every attention path (SDPA, the explicit path, the bf16 CPU path, both KV caches, CUDA graphs)
then takes the mask like any other, and the cached paths get exactly the mask row of each new query.

Sequence layout (dalle.py): positions 0..T hold BOS and the T text tokens (the "text region", text_len = T + 1),
position T + 1 + i holds image token i, in row-major grid order. The rules, as in DALLE-pytorch:
- every query sees only keys at or before its own position (causal), and every image query sees all the text;
- text queries are plain causal;
- an image query at grid cell (r, c) sees the image keys
    axial_row:  of its own row r (so cells (r, 0..c));
    axial_col:  of its own column c (so cells (0..r, c));
    conv_like:  in the kernel x kernel window that ends at (r, c): cells (r - dilation*a, c - dilation*b) for
                a, b in 0..kernel-1 (DALLE-pytorch pads the grid by (kernel - 1) * dilation on the top and the left
                and unfolds, so each window reaches up and to the left of its cell and never past it; checked
                against dalle-pytorch 1.6.6 itself, tests/test_convert_reference.py).
Note the query at the image position i predicts token i + 1; as in DALLE-pytorch the mask follows the grid cell of
the token the query sits on, not of the token it predicts.
Positions past the grid (the tail of a speculative window, whose outputs are never used) get plain causal rows.
"""
from __future__ import annotations

import torch


def attention_mask(kind: str, query_pos: torch.Tensor, key_pos: torch.Tensor, text_len: int, fmap: int,
                   kernel: int = 5, dilation: int = 1) -> torch.Tensor:
    """Boolean mask, True where the query at query_pos may attend to the key at key_pos.

    query_pos (..., n, 1) and key_pos (..., 1, k) are sequence positions (any broadcastable shapes); the result has
    their broadcast shape. kind 'full' is the causal mask.
    """
    mask = key_pos <= query_pos
    if kind == "full":
        return mask
    q_cell, k_cell = query_pos - text_len, key_pos - text_len
    q_row, q_col = torch.div(q_cell, fmap, rounding_mode="floor"), q_cell % fmap
    k_row, k_col = torch.div(k_cell, fmap, rounding_mode="floor"), k_cell % fmap
    if kind == "axial_row":
        local = k_row == q_row
    elif kind == "axial_col":
        local = k_col == q_col
    elif kind == "conv_like":
        local = _in_window(q_row - k_row, kernel, dilation) & _in_window(q_col - k_col, kernel, dilation)
    else:
        raise ValueError(f"unknown attention type {kind!r}")
    image_query = (q_cell >= 0) & (q_cell < fmap * fmap)
    text_key = k_cell < 0
    return mask & (~image_query | text_key | local)


def _in_window(back: torch.Tensor, kernel: int, dilation: int) -> torch.Tensor:
    """back: how many cells the key lies above (or left of) the query; in the window if 0, d, 2d, .. (kernel-1)d."""
    return (back >= 0) & (back % dilation == 0) & (back <= dilation * (kernel - 1))


class LayerMasks:
    """The attention mask of each layer for one transformer pass, each distinct type computed once.

    Layers of type 'full' get `full` (None for the plain causal paths, which need no mask, or the static cache's
    position mask), so a model of only full layers pays nothing here.
    """

    def __init__(self, types: list[str], text_len: int, fmap: int, kernel: int, dilation: int):
        self.types, self.text_len, self.fmap, self.kernel, self.dilation = types, text_len, fmap, kernel, dilation
        self.sparse = any(kind != "full" for kind in types)

    def for_pass(self, query_pos: torch.Tensor, key_len: int, full: torch.Tensor | None) -> list:
        """query_pos: (n,) positions shared by every row, or (B, n) per row (static cache). Returns one mask per
        layer: None / `full` for full layers, otherwise bool (n, key_len) or (B, 1, n, key_len)."""
        if not self.sparse:
            return [full] * len(self.types)
        keys = torch.arange(key_len, device=query_pos.device)
        q = query_pos.unsqueeze(-1)
        if query_pos.dim() == 2:  # (B, n) -> (B, 1, n, 1): one head axis for broadcasting
            q = q.unsqueeze(1)
        made = {}
        for kind in set(self.types) - {"full"}:
            made[kind] = attention_mask(kind, q, keys, self.text_len, self.fmap, self.kernel, self.dilation)
        return [full if kind == "full" else made[kind] for kind in self.types]
