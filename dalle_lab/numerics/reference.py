"""An independent reference for tpu_default: a CLIP vision tower's forward written out by hand, every matrix product
taken on bfloat16-rounded operands and summed in float64, every other op in float64.

`precision_mode(model, "tpu_default")` rounds the same operands but sums in float32 (in whatever order the CPU's
kernels use), as a TPU does in its own order. The two agree to float32 summation error wherever no rounding decision
flips; because rounding to bfloat16 is discontinuous, a last-bit difference in one product's output can move the
next product's operand by a whole bfloat16 step, so the gap also measures how sensitive a model is to summation order
(lab/studies/parity/sum_order.py; tests/test_numerics.py checks the tiny case).

Layout: transformers' CLIPVisionModelWithProjection (patch convolution without bias, class token, learned positions,
pre-LayerNorm, pre-norm blocks of attention and a two-layer MLP, post-LayerNorm of the class token, projection).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dalle_lab.numerics.modes import round_to_bf16


def _operand(x: torch.Tensor) -> torch.Tensor:
    """The value a bfloat16-operand product sees: rounded to bfloat16 (through float32, as the emulation's float32
    activations are), then widened to float64 so the sum is exact to float64."""
    return round_to_bf16(x.float()).double()


def _linear(x, layer, round_products: bool):
    weight, bias = layer.weight.double(), None if layer.bias is None else layer.bias.double()
    if round_products:
        x, weight = _operand(x), _operand(weight)
    out = x @ weight.t()
    return out if bias is None else out + bias


def _matmul(a, b, round_products: bool):
    return (_operand(a) @ _operand(b)) if round_products else a @ b


def _activation(name: str, x):
    if name == "quick_gelu":
        return x * torch.sigmoid(1.702 * x)
    if name == "gelu":
        return F.gelu(x)
    raise ValueError(f"the reference knows quick_gelu and gelu, not {name!r}")


@torch.no_grad()
def clip_vision_reference(model, pixel_values: torch.Tensor, round_products: bool = True) -> torch.Tensor:
    """image_embeds (B, projection_dim) float64 of a transformers CLIPVisionModelWithProjection, recomputed in
    float64 with (round_products) every product's operands rounded to bfloat16 first."""
    config = model.config
    vision = model.vision_model
    emb = vision.embeddings
    x = pixel_values.double()
    weight = emb.patch_embedding.weight.double()
    if round_products:
        x, weight = _operand(x), _operand(weight)
    patches = F.conv2d(x, weight, stride=emb.patch_embedding.stride)  # (B, D, h, w), no bias
    tokens = patches.flatten(2).transpose(1, 2)
    cls = emb.class_embedding.double().expand(tokens.shape[0], 1, -1)
    h = torch.cat([cls, tokens], dim=1) + emb.position_embedding.weight.double()[: tokens.shape[1] + 1]

    def norm(layer, value):
        return F.layer_norm(value, layer.normalized_shape, layer.weight.double(), layer.bias.double(), layer.eps)

    h = norm(vision.pre_layrnorm, h)
    heads = config.num_attention_heads
    for block in vision.encoder.layers:
        attn = block.self_attn
        y = norm(block.layer_norm1, h)
        b, n, d = y.shape

        def split(t):
            return t.view(b, n, heads, d // heads).transpose(1, 2)

        q = split(_linear(y, attn.q_proj, round_products))
        k = split(_linear(y, attn.k_proj, round_products))
        v = split(_linear(y, attn.v_proj, round_products))
        scores = _matmul(q * attn.scale, k.transpose(-1, -2), round_products)  # query scaled first (Flax's order)
        weights = scores.softmax(dim=-1)
        context = _matmul(weights, v, round_products).transpose(1, 2).reshape(b, n, d)
        h = h + _linear(context, attn.out_proj, round_products)
        y = norm(block.layer_norm2, h)
        y = _linear(_activation(config.hidden_act, _linear(y, block.mlp.fc1, round_products)), block.mlp.fc2,
                    round_products)
        h = h + y
    pooled = norm(vision.post_layernorm, h[:, 0])
    return _linear(pooled, model.visual_projection, round_products)
