"""The one-token decode step in the fewest torch ops: every layer, the final norm and the image head.

Why: at batch 4 a cached step through the modules is small arithmetic (about 37 MFLOP at the reference config)
behind about a hundred small ops and a Python module call per LayerNorm / Linear / Attention. `FusedStep` computes
the same function as `Transformer.forward` for one new token per row, all rows at one sequence position, over the
generation's KV caches (the prefill filled them through the modules):
- the weights gathered once per generation; each product multiplies as `linear.FewRowProduct` lays its weight
  out for the step's row count (the module path inside `packed_linears` multiplies the same way);
- keys/values written by index into the caches' preallocated buffers; attention by the same SDPA call the module
  path makes, so the logits match it to float rounding;
- rotary embeddings from per-position tables made once per generation (the same rotation as
  positional.apply_rotary, written as x * cos + swap(x) * sin, which rounds identically); token shift from the
  history of normalised inputs the prefill wrote into each cache's `side` (positional.ShiftHistory).

`step(plan, x, pos, io)` is one function for two callers: the eager FusedStep (pos an int: attention reads the
written prefix) and the compiled strategy (dalle_lab/generate/compiled.py: pos a 0-d tensor, fixed shapes, a
position mask over the whole buffer, products through F.linear on the modules' weights, which TorchInductor
freezes and prepacks).

Supported (`why_not_fused` says None): full attention in every layer, with any of `stable` (float32: PB-relax is the
plain attention function there, see attention._needs_explicit_pb_relax), `sandwich_norm`, `layer_scale`, shared
attention / feed-forward ids, tied embeddings, rotary embeddings (either rotary_style), token shift; in eval mode,
float32 weights, no autocast. The sparse attention types (per-layer masks), dropout in training mode and bf16 keep
the module path.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from .linear import FewRowProduct
from .positional import rotary_angles


class _Norm(NamedTuple):
    weight: torch.Tensor
    bias: torch.Tensor
    eps: float


class _Layer(NamedTuple):
    attn_norm: _Norm
    qkv: Callable
    attn_out: Callable
    attn_out_norm: _Norm | None  # sandwich_norm only
    ff_norm: _Norm
    ff_in: Callable
    ff_out: Callable
    ff_out_norm: _Norm | None
    attn_scale: torch.Tensor | None  # layer_scale only
    ff_scale: torch.Tensor | None


class Plan(NamedTuple):
    """What one step multiplies with, and the sequence geometry it needs."""
    layers: list[_Layer]
    final: Callable  # the model's final normalisation (PB-relax rescale included)
    head: Callable  # the image-logits product
    heads: int
    dim_head: int
    text_len: int  # BOS + text: image token i sits at sequence position text_len + i
    fmap: int
    shift: bool
    rotate_values: bool  # DALLE-pytorch's rotary (rotary_style "dallepytorch") rotates the values too
    sdpa: Callable  # the attention function the modules call (attention.Attention.sdpa), so the bits match theirs


class StepIO(NamedTuple):
    """The per-generation tensors a step reads and writes: one KV buffer (2, rows, heads, max_len, d) per layer,
    the token-shift histories (rows, max_len, dim) of each layer's two branches (token shift only), and the rotary
    tables (max_len, dim_head) (rotary only)."""
    buffers: list[torch.Tensor]
    histories: list[tuple[torch.Tensor, torch.Tensor]] | None
    cos: torch.Tensor | None
    sin: torch.Tensor | None


def why_not_fused(model) -> str | None:
    """Why `step` cannot compute this model's cached one-token step right now, or None where it can."""
    if model.transformer.masks.sparse:
        return f"sparse attention types {model.config.attn_types} need a mask per layer"
    if model.training:
        return "the model is in training mode (dropout)"
    if any(p.dtype != torch.float32 for p in model.parameters()):
        return "its weights are not float32"
    if torch.is_autocast_enabled(model.final_norm.weight.device.type):
        return "autocast is on (bf16 decoding runs its own attention kernel and packed weights)"
    return None


def _norm(module) -> _Norm:
    return _Norm(module.weight, module.bias, module.eps)


def plan(model, product: Callable) -> Plan:
    """The model's step plan; product(linear) -> the callable that multiplies by that Linear."""
    t = model.transformer
    layers = [_Layer(_norm(b.attn_norm), product(b.attn.to_qkv), product(b.attn.to_out),
                     _norm(b.attn_out_norm) if b.sandwich_norm else None, _norm(b.ff_norm),
                     product(b.ff.proj_in), product(b.ff.proj_out), _norm(b.ff_out_norm) if b.sandwich_norm else None,
                     b.attn_scale, b.ff_scale)
              for b in t.layers]
    return Plan(layers, model.final, product(model.to_image_logits), t.heads, t.dim_head, t.text_len, t.fmap,
                t.shift_tokens, t.layers[0].attn.rotate_values, t.layers[0].attn.sdpa)


def rotary_tables(model, max_len: int, device) -> tuple[torch.Tensor, torch.Tensor] | tuple[None, None]:
    """(cos, sin), each (max_len, dim_head), such that rotating x at position p is x * cos[p] + swap(x) * sin[p],
    swap exchanging the features of each rotated pair: the rotation of positional.apply_rotary, term for term
    (features past the rotary bands get cos 1 and sin 0)."""
    t = model.transformer
    if not t.rotary_emb:
        return None, None
    cos, sin = rotary_angles(torch.arange(max_len, device=device), t.text_len, t.fmap, t.dim_head, t.rotary_style)
    cos, sin = cos.view(max_len, -1), sin.view(max_len, -1)  # (max_len, pairs)
    pairs = cos.shape[1]
    full_cos = torch.ones(max_len, t.dim_head, device=device)
    full_sin = torch.zeros(max_len, t.dim_head, device=device)
    full_cos[:, :2 * pairs] = cos.repeat_interleave(2, dim=1)
    full_sin[:, :2 * pairs] = torch.stack([-sin, sin], dim=-1).flatten(1)  # a' = a cos - b sin, b' = b cos + a sin
    return full_cos, full_sin


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return x * cos + swapped * sin


def _at(table: torch.Tensor, pos) -> torch.Tensor:
    """Row pos of a (max_len, ...) tensor: by int in eager steps, by a 0-d tensor (no data-dependent shapes)."""
    return table[pos] if isinstance(pos, int) else table.index_select(0, pos.view(1)).squeeze(0)


def _shift(h: torch.Tensor, history: torch.Tensor, pos, plan: Plan) -> torch.Tensor:
    """Token shift of the image token at sequence position pos (positional.TokenShift): write its normalised input
    h (rows, dim) into the history, then take the first quarter of features from the cell above and the second
    from the cell to the left (zeros on the top row and the left column; quarters sized as torch.chunk sizes them)."""
    quarter = -(-h.shape[-1] // 4)
    cell = pos - plan.text_len
    if isinstance(pos, int):
        history.select(1, pos).copy_(h)
        top = history[:, pos - plan.fmap, :quarter] if cell >= plan.fmap else h.new_zeros(h.shape[0], quarter)
        left = history[:, pos - 1, quarter:2 * quarter] if cell % plan.fmap > 0 else h.new_zeros(h.shape[0], quarter)
    else:
        history.index_copy_(1, pos.view(1), h.unsqueeze(1))
        top = torch.where(cell >= plan.fmap, _at(history.transpose(0, 1), (pos - plan.fmap).clamp(min=0)), 0.0)
        left = torch.where(cell % plan.fmap > 0, _at(history.transpose(0, 1), pos - 1), 0.0)
        top, left = top[:, :quarter], left[:, quarter:2 * quarter]
    return torch.cat([top, left, h[:, 2 * quarter:]], dim=-1)


def _attend(qkv: torch.Tensor, buffer: torch.Tensor, pos, sdpa: Callable = F.scaled_dot_product_attention):
    """qkv (rows, 3, heads, d) of the token at pos: write its key and value, attend to positions 0..pos."""
    q = qkv[:, :1].transpose(1, 2)  # (rows, heads, 1, d)
    if isinstance(pos, int):
        buffer.select(3, pos).copy_(qkv[:, 1:].transpose(0, 1))
        keys_values = buffer.narrow(3, 0, pos + 1)
        return sdpa(q, keys_values[0], keys_values[1])
    buffer.index_copy_(3, pos.view(1), qkv[:, 1:].transpose(0, 1).unsqueeze(3))
    visible = (torch.arange(buffer.shape[3], device=buffer.device) <= pos).view(1, 1, 1, -1)
    return sdpa(q, buffer[0], buffer[1], attn_mask=visible)


def _branch_output(out: torch.Tensor, norm: _Norm | None, scale: torch.Tensor | None) -> torch.Tensor:
    """A branch's contribution to the residual stream, as Block.branch_output: sandwich norm, then LayerScale."""
    out = out if norm is None else F.layer_norm(out, out.shape[-1:], *norm)
    return out if scale is None else out * scale


def step(plan: Plan, x: torch.Tensor, pos, io: StepIO) -> torch.Tensor:
    """x (rows, dim): the embedded image tokens at sequence position pos (an int, or a 0-d int64 tensor when
    compiled) -> image logits (rows, num_image_tokens)."""
    rows, heads, d, shape = x.shape[0], plan.heads, plan.dim_head, x.shape[-1:]
    cos, sin = (None, None) if io.cos is None else (_at(io.cos, pos), _at(io.sin, pos))
    for i, layer in enumerate(plan.layers):
        h = F.layer_norm(x, shape, *layer.attn_norm)
        if plan.shift:
            h = _shift(h, io.histories[i][0], pos, plan)
        qkv = layer.qkv(h).view(rows, 3, heads, d)
        if cos is not None:
            qkv = (_rotate(qkv, cos, sin) if plan.rotate_values else
                   torch.cat([_rotate(qkv[:, :2], cos, sin), qkv[:, 2:]], dim=1))
        out = layer.attn_out(_attend(qkv, io.buffers[i], pos, plan.sdpa).reshape(rows, heads * d))
        x = x + _branch_output(out, layer.attn_out_norm, layer.attn_scale)
        h = F.layer_norm(x, shape, *layer.ff_norm)
        if plan.shift:
            h = _shift(h, io.histories[i][1], pos, plan)
        value, gate = layer.ff_in(h).chunk(2, dim=-1)
        out = layer.ff_out(value * F.gelu(gate))
        x.add_(_branch_output(out, layer.ff_out_norm, layer.ff_scale))  # x is this function's own tensor here
    return plan.head(plan.final(x))


def step_io(model, caches, max_len: int) -> StepIO:
    """The StepIO of a generation's KV caches, after the prefill wrote them (it allocated every buffer)."""
    histories = None
    if model.transformer.shift_tokens:
        histories = [(cache.side["attn"].buffer, cache.side["ff"].buffer) for cache in caches]
    cos, sin = rotary_tables(model, max_len, caches[0].buffer.device)
    return StepIO([cache.buffer for cache in caches], histories, cos, sin)


def _few_row_product(rows: int):
    def product(linear):
        # packed as packed_linears packed it, otherwise in F.linear's layout
        return FewRowProduct(linear, rows, kind=None if getattr(linear, "packed", None) is not None else "linear")
    return product


class FusedStep:
    """fused(x, pos) for x (rows, dim), the embedded tokens at sequence position pos (an int) -> image logits.

    Reads and writes the caches given (after the prefill). The weights are those of the model when the FusedStep
    was built (one generation): do not train between steps."""

    def __init__(self, model, caches, rows: int):
        self.plan = plan(model, _few_row_product(rows))
        self.max_len = caches[0].max_len
        self.io = step_io(model, caches, self.max_len)

    def __call__(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        if pos >= self.max_len:
            raise ValueError(f"KV cache overflow: writing position {pos} into a cache of {self.max_len}")
        return step(self.plan, x, pos, self.io)
