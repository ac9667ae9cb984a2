"""A fused one-token decode step: every layer, the final norm and the image head, in the fewest torch ops.

Why: at batch 4 a cached step through the modules is small arithmetic (about 37 MFLOP) behind about a hundred
small ops and a Python module call per LayerNorm / Linear / Attention; on an AVX2 Zen 3 this step does the same
work in about 0.8 of the module path's time with the same products (docs/performance.md, "Cached generation on an
AVX2 Zen 3"). It computes the same function as `Transformer.forward` for one new token per row, all rows at the
same position, over the growing KVCache:
- weights gathered once per generation into plain tuples (no module dispatch in the hot loop); inside
  linear.packed_linears they are laid out as linear.PRODUCT_KINDS says for few-row products (oneDNN-prepacked up
  to 32 rows), as the module path would multiply them, otherwise used as F.linear uses them;
- keys/values written by index into the KVCache buffers the prefill filled (preallocated to the full length);
- attention by the same SDPA call the module path makes, so the logits match it to float rounding;
- residual adds in place.

Supported: the default model, `stable` (float32: PB-relax is the plain attention function there, see
attention._needs_explicit_pb_relax; the final-norm rescale is model._final's), `sandwich_norm`, `layer_scale`, shared attention /
feed-forward ids, tied embeddings. Everything else keeps the module path (`fused_supported` says False): the sparse
attention types (axial_row, axial_col, conv_like: per-layer masks), `rotary_emb`, `shift_tokens`, a model in
training mode (dropout), weights that are not float32 or CPU bf16 autocast (the bf16 path has its own attention
kernel and packed weights), and the static cache of speculative decoding and CUDA graphs.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from .linear import FewRowProduct as _Product


class _Norm(NamedTuple):
    weight: torch.Tensor
    bias: torch.Tensor
    eps: float


class _Layer(NamedTuple):
    attn_norm: _Norm
    qkv: _Product
    attn_out: _Product
    attn_out_norm: _Norm | None  # sandwich_norm only
    ff_norm: _Norm
    ff_in: _Product
    ff_out: _Product
    ff_out_norm: _Norm | None
    attn_scale: torch.Tensor | None  # layer_scale only
    ff_scale: torch.Tensor | None


def fused_supported(model, x_dtype: torch.dtype = torch.float32) -> bool:
    """Whether FusedStep computes this model's cached step (see the module docstring for what falls back)."""
    t = model.transformer
    weights_fp32 = all(p.dtype == torch.float32 for p in model.parameters())
    autocast = torch.is_autocast_enabled(model.final_norm.weight.device.type)
    return (not model.training and not t.extras and weights_fp32 and x_dtype == torch.float32 and not autocast)


def _norm(module) -> _Norm:
    return _Norm(module.weight.detach(), module.bias.detach(), module.eps)


def _detached(parameter):
    return None if parameter is None else parameter.detach()


def _product(linear, rows: int) -> _Product:
    """The Linear's product for `rows` rows: packed as packed_linears packed it, or in F.linear's layout."""
    return _Product(linear, rows, kind=None if getattr(linear, "packed", None) is not None else "linear")


class FusedStep:
    """step(x, pos) for x (rows, dim), the embedded tokens at sequence position pos -> image logits (rows, V).

    Reads and writes the caches given (the Decoder's growing KVCaches, after prefill). The weights are those of
    the model when the FusedStep was built (one generation): do not train between steps."""

    def __init__(self, model, caches, rows: int):
        t = model.transformer
        self.heads, self.dim_head, self.caches = t.heads, t.dim_head, caches
        sandwich = [layer.sandwich_norm for layer in t.layers]
        self.layers = [_Layer(_norm(b.attn_norm), _product(b.attn.to_qkv, rows), _product(b.attn.to_out, rows),
                              _norm(b.attn_out_norm) if s else None, _norm(b.ff_norm),
                              _product(b.ff.proj_in, rows), _product(b.ff.proj_out, rows),
                              _norm(b.ff_out_norm) if s else None, _detached(b.attn_scale), _detached(b.ff_scale))
                       for b, s in zip(t.layers, sandwich)]
        self.final = model._final if model.config.stable else None  # PB-relax rescale before the final norm
        self.final_norm = _norm(model.final_norm)
        self.head = _product(model.to_image_logits, rows)
        self.shape = (model.config.dim,)

    def __call__(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        rows, heads, d, shape = x.shape[0], self.heads, self.dim_head, self.shape
        if pos >= self.caches[0].max_len:
            raise ValueError(f"KV cache overflow: writing position {pos} into a cache of {self.caches[0].max_len}")
        for layer, cache in zip(self.layers, self.caches):
            qkv = layer.qkv(F.layer_norm(x, shape, *layer.attn_norm)).view(rows, 3, heads, d)
            buffer = cache.buffer  # (2, rows, heads, max_len, d), allocated by the prefill
            buffer.select(3, pos).copy_(qkv[:, 1:].transpose(0, 1))
            keys_values = buffer.narrow(3, 0, pos + 1)
            attn = F.scaled_dot_product_attention(qkv[:, :1].transpose(1, 2), keys_values[0], keys_values[1])
            out = layer.attn_out(attn.reshape(rows, heads * d))
            out = out if layer.attn_out_norm is None else F.layer_norm(out, shape, *layer.attn_out_norm)
            x = x + (out if layer.attn_scale is None else out * layer.attn_scale)
            value_gate = layer.ff_in(F.layer_norm(x, shape, *layer.ff_norm))
            value, gate = value_gate.chunk(2, dim=-1)
            out = layer.ff_out(value * F.gelu(gate))
            out = out if layer.ff_out_norm is None else F.layer_norm(out, shape, *layer.ff_out_norm)
            x.add_(out if layer.ff_scale is None else out * layer.ff_scale)
        if self.final is not None:
            return self.head(self.final(x))
        return self.head(F.layer_norm(x, shape, *self.final_norm))
