"""Causal multi-head self-attention over a key/value cache, with CogView's PB-relax.

The cache is generation's (dalle_lab/generate/cache.py): any object with `write(start, kv)` (every row at the same
positions; returns the keys/values written so far) and `scatter(positions, kv)` (each row at its own positions;
returns the whole buffers, masked by the caller with `position_mask`).

Three code paths compute the same function:
- the default calls torch.nn.functional.scaled_dot_product_attention (SDPA), which picks a fused kernel;
- the explicit path forms the score matrix itself. It runs when the caller asks for the attention weights
  (attention heatmaps), and for `stable=True` in float16 only (see `_needs_explicit_pb_relax`: PB-relax must act
  between the score matmul and the softmax, which SDPA does not expose, and only float16 can overflow there);
- attention_math "dallepytorch" (models converted from DALLE-pytorch) sums as DALLE-pytorch 1.6.6 did instead of
  calling SDPA (dallepytorch_attention), so their logits match the original's to float32 rounding at any size;
- bfloat16 on the CPU (autocast training and generation) uses plain bf16 matmuls, faster there than SDPA's kernel,
  for the full sequence and the cached steps alike, so all three bf16 paths agree bit for bit.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from .linear import Linear
from .positional import apply_rotary

# CogView's PB-relax constant: scores are computed as (q / (alpha * sqrt(d))) @ k^T, i.e. alpha times smaller than
# usual, so the matmul's output stays inside float16's range; the row max is subtracted and the result is multiplied
# back by alpha before the softmax, which leaves the softmax mathematically unchanged.
PB_RELAX_ALPHA = 32.0


def position_mask(positions: torch.Tensor, kv_len: int) -> torch.Tensor:
    """Boolean (B, 1, n, kv_len) mask, True where the query at positions[b, i] may attend to key slot j (j <= it)."""
    keys = torch.arange(kv_len, device=positions.device)
    return (keys <= positions.unsqueeze(-1)).unsqueeze(1)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, dropout: float = 0.0, stable: bool = False,
                 rotate_values: bool = False, math: str = "sdpa"):
        super().__init__()
        # "dallepytorch": DALLE-pytorch's summation order instead of SDPA's fused kernel (dallepytorch_attention)
        self.sdpa = partial(dallepytorch_attention, stable=stable) if math == "dallepytorch" else \
            F.scaled_dot_product_attention
        self.rotate_values = rotate_values  # DALLE-pytorch's rotary rotated the values too (rotary_style)
        self.heads = heads
        self.dim_head = dim_head
        self.stable = stable
        self.dropout = dropout
        inner = heads * dim_head
        self.to_qkv = Linear(dim, 3 * inner, bias=False)  # one fused matmul for queries, keys and values
        self.to_out = Linear(inner, dim)
        self.out_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, cache=None, start: int = 0,
                return_attention: bool = False, positions: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, rotary: tuple[torch.Tensor, torch.Tensor] | None = None):
        """x: (B, L, dim) holding sequence positions start..start+L-1.

        With a cache, the new keys/values are written at those positions and the queries attend to everything
        cached so far. Returns the output (B, L, dim) and, if return_attention, the weights (B, heads, L, start+L).
        With positions (B, L) (each row's tokens at their own positions), the cache is written by scatter and mask
        (see position_mask) says which key slots each query sees; `start` is unused. Without positions, mask
        (L, start+L) (a sparse attention type, masks.py) replaces the causal mask. rotary: (cos, sin) of the L
        positions (positional.py), applied to queries and keys (and values, with rotate_values) before they are
        cached.
        """
        b, n, _ = x.shape
        qkv = self.to_qkv(x).view(b, n, 3, self.heads, self.dim_head).permute(2, 0, 3, 1, 4)  # (3, B, H, n, d)
        q, kv = qkv[0], qkv[1:]
        if rotary is not None:
            q = apply_rotary(q, *rotary)
            v = apply_rotary(qkv[2], *rotary) if self.rotate_values else qkv[2]
            kv = torch.stack([apply_rotary(qkv[1], *rotary), v])
        explicit = return_attention or (self.stable and _needs_explicit_pb_relax(q))
        if positions is not None:
            k, v = cache.scatter(positions, kv)
            kv_len = mask.shape[-1]
            k, v = k[:, :, :kv_len], v[:, :, :kv_len]
            if explicit:
                out, weights = self._explicit_attention(q, k, v, start, mask=mask)
            else:
                out, weights = self.sdpa(q, k, v, attn_mask=mask), None
            out = self.to_out(out.transpose(1, 2).reshape(b, n, self.heads * self.dim_head))
            return out, weights
        if cache is not None:
            k, v = cache.write(start, kv)
        elif start != 0:
            raise ValueError("start > 0 needs a KV cache holding the earlier positions")
        else:
            k, v = kv[0], kv[1]

        weights = None
        if explicit:
            out, weights = self._explicit_attention(q, k, v, start, mask=mask)
        else:
            dropout_p = self.dropout if self.training else 0.0
            if q.dtype == torch.bfloat16 and q.device.type == "cpu":
                # one kernel for every bf16 CPU call (full sequence, cached prefix, one cached step), so cached
                # generation, uncached generation and a teacher-forced pass give bit-identical logits
                out = _cpu_bf16_causal_attention(q, k, v, dropout_p, start, mask)
            elif mask is not None:  # a sparse attention type: its own mask row for each query
                out = self.sdpa(q, k, v, attn_mask=mask, dropout_p=dropout_p)
            elif n == 1:  # one new query sees every cached position: no mask at all
                out = self.sdpa(q, k, v, dropout_p=dropout_p)
            elif start == 0:  # whole sequence (training, or the prompt in generation)
                out = self.sdpa(q, k, v, dropout_p=dropout_p, is_causal=True)
            else:  # several new tokens after a cached prefix: the causal mask is offset by `start`
                out = self.sdpa(q, k, v, attn_mask=_causal_mask(n, k.shape[2], start, x.device),
                                                     dropout_p=dropout_p)
        out = self.to_out(out.transpose(1, 2).reshape(b, n, self.heads * self.dim_head))
        if self.dropout > 0:
            out = self.out_dropout(out)
        return out, weights

    def _explicit_attention(self, q, k, v, start: int, mask: torch.Tensor | None = None):
        scale = self.dim_head ** -0.5
        if self.stable:
            # PB-relax (CogView, section 2.4): shrink before the matmul, subtract the row max, scale back.
            scores = (q * (scale / PB_RELAX_ALPHA)) @ k.transpose(-1, -2)
        else:
            scores = (q * scale) @ k.transpose(-1, -2)
        n, total = q.shape[2], k.shape[2]
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        elif n > 1:
            scores = scores.masked_fill(~_causal_mask(n, total, start, q.device), float("-inf"))
        if self.stable:
            scores = (scores - scores.amax(dim=-1, keepdim=True).detach()) * PB_RELAX_ALPHA
        weights = scores.softmax(dim=-1)
        if self.training and self.dropout > 0:
            weights = F.dropout(weights, p=self.dropout)
        return weights @ v, weights


def dallepytorch_attention(q, k, v, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                           stable: bool = False):
    """scaled_dot_product_attention's function summed as DALLE-pytorch 1.6.6 sums it: the scores as the batched
    product of the scaled queries and the keys (what its einsum computes; matmul skips einsum's parsing, which cost
    more than the product at one query), masked with the most negative float, its stable softmax (a 1024th of the
    scores, minus their row max, times 1024) where `stable`, and the product with the values. SDPA's fused kernel
    adds in another order: with it a converted model's logits drift from its file's by float32 rounding, up to 2e-5
    at dim 512 (6e-6 this way)."""
    scores = torch.matmul(q * q.shape[-1] ** -0.5, k.transpose(-1, -2))  # the batched product its einsum makes
    if is_causal:
        attn_mask = _causal_mask(q.shape[2], k.shape[2], k.shape[2] - q.shape[2], q.device)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, -torch.finfo(scores.dtype).max)
    if stable:
        scores = scores / 1024
        scores = (scores - scores.amax(dim=-1, keepdim=True).detach()) * 1024
    weights = scores.softmax(dim=-1)
    if dropout_p > 0:
        weights = F.dropout(weights, p=dropout_p)
    return torch.matmul(weights, v)


def _needs_explicit_pb_relax(q: torch.Tensor) -> bool:
    """Whether stable=True must take the explicit PB-relax path for these queries.

    PB-relax computes softmax((S - max S) * alpha) with S = q k^T / (alpha sqrt(d)), which is mathematically
    softmax(q k^T / sqrt(d)): the plain attention function. Its only purpose is that the score matrix, where it is
    materialised in the input dtype, stays alpha times smaller before the max is subtracted. SDPA's kernels never
    hold the scores in float16 before subtracting the row max (fused kernels accumulate in float32 and run an
    online softmax) or run in float32 / bfloat16, whose range (3.4e38) no score reaches; so outside float16 the
    fused call computes the same function without the (B, heads, L, L) float32 score tensor. In float16, SDPA may
    pick its math fallback (on CUDA for shapes the fused kernels refuse, or under precision modes that decompose
    attention), which forms q k^T in float16 and overflows past 65504: there the explicit path stays.
    """
    return q.dtype == torch.float16


def _cpu_bf16_causal_attention(q, k, v, dropout_p: float, start: int = 0, mask: torch.Tensor | None = None):
    """Causal attention in bfloat16 on the CPU, for the full-sequence pass (training) under bf16 autocast.

    On this project's CPUs the fused SDPA kernel is slow in bfloat16 (its backward especially): measured at the
    reference shape (8 x 8 heads x 288 x 32), forward + backward, 1 thread: 59 ms with SDPA vs 39 ms here, and
    the plain matmuls win in bfloat16 while SDPA wins in float32. The scores are rounded to bfloat16 (the
    matmuls accumulate in float32), as in any explicit bf16 attention; the softmax kernel accumulates in float32.
    Autocast is paused so the softmax is not promoted to float32 (which would cost the gain back).
    `start` > 0: the queries are positions start.. after a cached prefix (generation); the same arithmetic as the
    full pass, so a position's output does not depend on which path computed it (tested bit for bit).
    mask: a sparse attention type's mask (masks.py), replacing the causal one.
    """
    n, total = q.shape[2], k.shape[2]
    with torch.autocast("cpu", enabled=False):
        scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)
        if mask is not None:
            scores = scores.masked_fill_(~mask, float("-inf"))
        elif n > 1 or total != start + n:
            scores = scores.masked_fill_(~_causal_mask(n, total, start, q.device), float("-inf"))
        weights = scores.softmax(dim=-1)
        if dropout_p > 0:
            weights = F.dropout(weights, p=dropout_p)
        return weights @ v


def _causal_mask(n_new: int, total: int, start: int, device) -> torch.Tensor:
    """Boolean (n_new, total) mask, True where query start+i may attend to key j (j <= start+i)."""
    query_pos = torch.arange(start, start + n_new, device=device).unsqueeze(1)
    return torch.arange(total, device=device).unsqueeze(0) <= query_pos
