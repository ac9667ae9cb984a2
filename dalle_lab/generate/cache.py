"""The KV cache: keys and values of one attention layer for every row of a generation, preallocated once.

One buffer (2, rows, heads, max_len, dim_head) per layer, zero-filled at its first write, serves every strategy:
- rows at one shared position (plain, fused and compiled one-token passes, and every prefill): `write(start, kv)`
  copies the new keys/values in place and returns the prefix [0, end) as views, so attention reads exactly the
  positions written (no torch.cat of a growing tensor: time per token grows only with the attention span);
- rows at their own positions (speculative windows advance each row by what it accepted; CUDA graphs need fixed
  shapes): `scatter(positions, kv)` writes each row at its positions and returns the whole buffer, and the caller
  masks what a query may not see (model/attention.position_mask). Masked slots hold zeros, not garbage, because a
  weight of 0 times NaN is still NaN.
`side` holds the layer's other per-row state over positions (token shift's history of normalised inputs, written
by model/positional.TokenShift). The cache keeps no position counter: the caller says where the tokens sit.
"""
from __future__ import annotations

import torch


class KVCache:
    def __init__(self, max_len: int):
        self.max_len = max_len
        self.buffer: torch.Tensor | None = None
        self.side: dict = {}

    def _allocate(self, kv: torch.Tensor) -> None:
        # at the first write, so the buffer takes the dtype the layer produces (bfloat16 under autocast)
        two, rows, heads, _, dim_head = kv.shape
        self.buffer = kv.new_zeros(two, rows, heads, self.max_len, dim_head)

    def write(self, start: int, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """kv (2, rows, heads, n, dim_head) for positions start..start+n-1 of every row -> (keys, values) of
        positions 0..start+n-1."""
        end = start + kv.shape[3]
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: writing positions {start}..{end - 1} into a cache of {self.max_len}")
        if self.buffer is None:
            self._allocate(kv)
        self.buffer[:, :, :, start:end] = kv
        prefix = self.buffer[:, :, :, :end]
        return prefix[0], prefix[1]

    def scatter(self, positions: torch.Tensor, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (rows, n): the sequence positions of kv (2, rows, heads, n, dim_head) -> the whole (keys,
        values) buffers (rows, heads, max_len, dim_head)."""
        if self.buffer is None:
            self._allocate(kv)
        two, rows, heads, n, dim_head = kv.shape
        index = positions.view(1, rows, 1, n, 1).expand(two, rows, heads, n, dim_head)
        self.buffer.scatter_(3, index, kv.to(self.buffer.dtype))
        return self.buffer[0], self.buffer[1]


def new_caches(layers: int, max_len: int) -> list[KVCache]:
    return [KVCache(max_len) for _ in range(layers)]
