"""Pre-norm transformer blocks: causal attention + GEGLU feed-forward, optional sandwich norm.

DALLE-pytorch's options (all off by default; docs/model.md): per-layer attention types as masks (masks.py), rotary
embeddings and token shift (positional.py), and layers sharing their attention / feed-forward modules.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .attention import Attention, position_mask
from .linear import Linear
from .masks import LayerMasks
from .positional import TokenShift, rotary_angles


class FeedForward(nn.Module):
    """GEGLU feed-forward (as in DALLE-pytorch, so parameter counts compare like with like)."""

    def __init__(self, dim: int, mult: int = 4, dropout: float = 0.0):
        super().__init__()
        hidden = dim * mult
        self.proj_in = Linear(dim, hidden * 2)  # value and gate in one matmul
        self.dropout = nn.Dropout(dropout)
        self.proj_out = Linear(hidden, dim)

    def forward(self, x):
        value, gate = self.proj_in(x).chunk(2, dim=-1)
        hidden = value * F.gelu(gate)
        if self.dropout.p > 0:
            hidden = self.dropout(hidden)
        return self.proj_out(hidden)


class Block(nn.Module):
    """x + branch(LayerNorm(x)) for attention then feed-forward.

    sandwich_norm (CogView's sandwich-LN) adds a second LayerNorm on each branch's output before the residual add,
    bounding what each block can add to the residual stream: x + LayerNorm_out(branch(LayerNorm_in(x))).
    layer_scale (CaiT, as DALLE-pytorch) multiplies each branch's output, after that norm, by a learned per-feature
    scale, initialised small so each block starts close to the identity. The scales belong to the block, not to the
    attention / feed-forward modules, so layers that share those (shared_attn_ids) keep their own.
    """

    def __init__(self, dim, heads, dim_head, ff_mult=4, attn_dropout=0.0, ff_dropout=0.0, stable=False,
                 sandwich_norm=False, layer_scale: float | None = None, rotate_values: bool = False,
                 attention_math: str = "sdpa"):
        super().__init__()
        self.attn_norm = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, dim_head, dropout=attn_dropout, stable=stable, rotate_values=rotate_values,
                              math=attention_math)
        self.ff_norm = nn.LayerNorm(dim)
        self.ff = FeedForward(dim, ff_mult, ff_dropout)
        self.sandwich_norm = sandwich_norm
        if sandwich_norm:
            self.attn_out_norm = nn.LayerNorm(dim)
            self.ff_out_norm = nn.LayerNorm(dim)
        self.attn_scale = self.ff_scale = None
        if layer_scale is not None:
            self.attn_scale = nn.Parameter(torch.full((dim,), layer_scale))
            self.ff_scale = nn.Parameter(torch.full((dim,), layer_scale))

    def branch_output(self, out, which: str):
        """A branch's contribution to the residual stream: sandwich norm, then LayerScale (either optional)."""
        if self.sandwich_norm:
            out = (self.attn_out_norm if which == "attn" else self.ff_out_norm)(out)
        scale = self.attn_scale if which == "attn" else self.ff_scale
        return out if scale is None else out * scale

    def forward(self, x, cache=None, start: int = 0, return_attention: bool = False,
                positions=None, mask=None, rotary=None, shift: TokenShift | None = None):
        h = self.attn_norm(x)
        if shift is not None:
            h = shift(h, cache, "attn")
        attn_out, weights = self.attn(h, cache=cache, start=start, return_attention=return_attention,
                                      positions=positions, mask=mask, rotary=rotary)
        ff_in = x + self.branch_output(attn_out, "attn")
        h = self.ff_norm(ff_in)
        if shift is not None:
            h = shift(h, cache, "ff")
        return ff_in + self.branch_output(self.ff(h), "ff"), weights


class Transformer(nn.Module):
    # Set True (train_dalle.py --gradient_checkpointing) to keep only each block's input during training and recompute
    # the block in the backward: activation memory of one block instead of `depth`, for about a third more compute.
    # The same numbers either way (the RNG state is replayed for dropout), so it is not part of the model's config.
    gradient_checkpointing: bool = False

    def __init__(self, dim, depth, heads, dim_head, ff_mult=4, attn_dropout=0.0, ff_dropout=0.0, stable=False,
                 sandwich_norm=False, *, attn_types=("full",), text_len=None, fmap=None, conv_kernel_size=5,
                 conv_dilation=1, rotary_emb=False, shift_tokens=False, shared_attn_ids=None, shared_ff_ids=None,
                 layer_scale=False, rotary_style="dalle_lab", attention_math="sdpa"):
        """attn_types, shared_attn_ids, shared_ff_ids are cycled over the layers (DALLE-pytorch's rule); text_len
        (BOS + text) and fmap (grid side) place the image grid in the sequence for the masks, rotary and shift.
        rotary_style "dallepytorch": DALLE-pytorch's angles, and the values are rotated too (positional.py)."""
        super().__init__()
        self.heads, self.dim_head = heads, dim_head
        rotate_values = rotary_emb and rotary_style.startswith("dallepytorch")
        self.layers = nn.ModuleList(
            Block(dim, heads, dim_head, ff_mult, attn_dropout, ff_dropout, stable, sandwich_norm,
                  layer_scale=layer_scale_init(i) if layer_scale else None, rotate_values=rotate_values,
                  attention_math=attention_math)
            for i in range(depth)
        )
        _share(self.layers, "attn", shared_attn_ids)
        _share(self.layers, "ff", shared_ff_ids)
        self.text_len, self.fmap = text_len, fmap
        self.masks = LayerMasks([attn_types[i % len(attn_types)] for i in range(depth)], text_len, fmap,
                                conv_kernel_size, conv_dilation)
        self.rotary_emb, self.shift_tokens, self.rotary_style = rotary_emb, shift_tokens, rotary_style
        # the default model skips all per-pass extras (positions, masks, angles): its decode step is unchanged
        self.extras = self.masks.sparse or rotary_emb or shift_tokens

    def forward(self, x, caches: list | None = None, start: int = 0, return_attention: bool = False,
                positions=None, kv_len: int | None = None):
        """Returns (x, attentions): attentions is a list with one (B, heads, L, start+L) tensor per layer, or None.

        caches: one KV cache per layer (dalle_lab/generate/cache.py); the tokens sit at positions start.. of every
        row, or, with positions (B, L), each at its own sequence position, and then the queries attend to key
        slots [0, kv_len) (default: the whole cache) up to their own position.
        """
        attentions = [] if return_attention else None
        mask = None
        if positions is not None:  # one mask for all layers
            mask = position_mask(positions, caches[0].max_len if kv_len is None else kv_len)
        masks, rotary, shift = self._extras(x, start, positions, kv_len, mask, caches) if self.extras else (
            None, None, None)
        # only a training pass that builds a graph gains from recomputation; cached decoding never does
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled() and caches is None
        for i, layer in enumerate(self.layers):
            layer_mask = mask if masks is None else masks[i]
            if recompute:
                x, weights = checkpoint(layer, x, None, start, return_attention, positions, layer_mask, rotary, shift,
                                        use_reentrant=False)
            else:
                x, weights = layer(x, cache=None if caches is None else caches[i], start=start,
                                   return_attention=return_attention, positions=positions, mask=layer_mask,
                                   rotary=rotary, shift=shift)
            if return_attention:
                attentions.append(weights)
        return x, attentions

    def _extras(self, x, start, positions, kv_len, mask, caches):
        """Per-layer masks, rotary angles and the token shift for the tokens of this pass (computed once per pass,
        shared by the layers). Query positions: `positions` (B, n) with static caches, else start..start+n-1."""
        if positions is not None:
            query_pos, key_len = positions, mask.shape[-1]
        else:
            query_pos = torch.arange(start, start + x.shape[1], device=x.device)
            key_len = start + x.shape[1]
        masks = self.masks.for_pass(query_pos, key_len, mask) if self.masks.sparse else None
        rotary = (rotary_angles(query_pos, self.text_len, self.fmap, self.dim_head, self.rotary_style)
                  if self.rotary_emb else None)
        shift = TokenShift(query_pos, self.text_len, self.fmap) if self.shift_tokens else None
        return masks, rotary, shift


def layer_scale_init(index: int) -> float:
    """LayerScale's initial value for the block at 0-based `index` (CaiT's rule, as DALLE-pytorch): smaller in
    deeper networks' later blocks."""
    layer = index + 1
    return 0.1 if layer <= 18 else 1e-5 if layer <= 24 else 1e-6


def _share(layers: nn.ModuleList, name: str, ids):
    """Layers whose (cycled) ids are equal use the first such layer's `name` submodule (DALLE-pytorch's
    shared_attn_ids / shared_ff_ids). Each layer keeps its own LayerNorms, as there."""
    if ids is None:
        return
    first = {}
    for i, layer in enumerate(layers):
        owner = first.setdefault(ids[i % len(ids)], layer)
        if owner is not layer:
            setattr(layer, name, getattr(owner, name))
