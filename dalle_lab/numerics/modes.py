"""Numeric precision modes for any torch model: fp32, bf16, fp16 and emulated TPU-default ("tpu_default").

Why this exists: a published aesthetic-reward fine-tuning result ran its CLIP scorer on TPUs, whose DEFAULT matrix
precision rounds the operands of every matrix product to bfloat16 and accumulates in float32, even when all tensors are
float32. The CLIP embeddings moved far enough (cosine about 0.8 to the float32 ones) that the fine-tuned model learned
to please the artefact. These modes let one run the same reward model in each precision on a CPU or GPU and compare.

    with precision_mode(model, "tpu_default") as handle:
        scores = model(images)
    handle.num_products   # how many matrix products were rounded (a test checks it against the model's count)

Modes:
- "fp32": parameters and floating inputs in float32, TF32 (CUDA) and reduced-precision oneDNN (CPU) float32
  products disabled: true float32 products.
- "bf16" / "fp16": parameters, buffers and floating inputs cast to bfloat16 / float16 (what `.bfloat16()` users do);
  the original tensors are put back on exit, so the model is bit-for-bit what it was.
- "tpu_default": the model stays float32; every matrix product (linear, matmul, bmm, einsum, convolution, addmm /
  baddbmm, attention products) has its float32 operands rounded to bfloat16 (round to nearest even) and is then
  multiplied and accumulated in float32. The product of two bfloat16 numbers is exact in float32, so this reproduces
  the TPU's products exactly and differs only in summation order. LayerNorm, softmax, GELU and every other op stay
  float32. It works on aten ops (a TorchDispatchMode), so it reaches products however a model spells them; kernels
  that hide products inside (fused attention, RNN kernels, cdist, sparse and quantised products, linear-algebra
  routines) are either decomposed (scaled_dot_product_attention) or refused with an error naming the op. Every other
  op is checked against an allow-list of ops that multiply no matrices; one outside it that takes a float32 matrix (an
  unlisted aten op, a custom op from torch.library) is reported by name, never silently skipped. The tables are in
  op_kinds.py. Gradients pass straight through the rounding.

The tpu_default rounding applies to every product computed inside the `with` block (on a TPU it is global too), not
only the model's: a reward's head and preprocessing run under it as well.
"""
from __future__ import annotations

import contextlib
import math
import warnings
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.nn.utils.stateless import _reparametrize_module
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from dalle_lab.numerics.op_kinds import PRODUCT_OPERANDS, op_kind, refusal, takes_float32_matrix

PRECISION_MODES = ("fp32", "bf16", "fp16", "tpu_default")


def check_mode(mode: str) -> str:
    if mode not in PRECISION_MODES:
        raise ValueError(f"unknown precision mode {mode!r}; choose one of {', '.join(PRECISION_MODES)}")
    return mode


def round_to_bf16(tensor):
    """Round a float32 tensor to the nearest bfloat16 value (ties to even), returned as float32.

    torch's float32 -> bfloat16 conversion rounds to nearest even; casting back is exact.
    """
    if tensor.dtype != torch.float32:
        return tensor
    return tensor.to(torch.bfloat16).to(torch.float32)


@dataclass
class PrecisionHandle:
    """What a `precision_mode` block did: the mode and, for tpu_default, the products it rounded by aten op, and
    the ops it did not know that took float32 tensors of rank >= 2 (`unknown`, by qualified name)."""

    mode: str
    products: Counter = field(default_factory=Counter)
    unknown: Counter = field(default_factory=Counter)

    @property
    def num_products(self) -> int:
        """Matrix products intercepted (a decomposed scaled_dot_product_attention counts as its two products)."""
        return sum(self.products.values())


class _DecomposeAttention(TorchFunctionMode):
    """Rewrites scaled_dot_product_attention as two matmuls and a float32 softmax, which the dispatch mode rounds.

    As in Flax's dot_product_attention (what the TPU run used), the query is scaled before the first product.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return _attention_math(*args, **kwargs)
        return func(*args, **kwargs)


class _RoundProductOperands(TorchDispatchMode):
    """Rounds the float32 operands of every matrix product to bfloat16, refuses hidden-product kernels, and counts
    (and reports per `unknown_ops`) the ops outside op_kinds' allow-list that take float32 matrices."""

    def __init__(self, handle: PrecisionHandle, unknown_ops: str):
        super().__init__()
        self.handle, self.unknown_ops = handle, unknown_ops
        self.kinds: dict = {}  # op -> kind, classified once per op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = self.kinds.get(func)
        if kind is None:
            kind = self.kinds[func] = op_kind(func)
        if kind == "free":
            return func(*args, **kwargs)
        name = func._schema.name.split("::", 1)[-1]
        operands = PRODUCT_OPERANDS.get(name) if kind == "product" else None
        if operands is not None and any(
                i < len(args) and isinstance(args[i], torch.Tensor) and args[i].dtype == torch.float32
                for i in operands):
            args = list(args)
            for i in operands:
                if i < len(args) and isinstance(args[i], torch.Tensor):
                    args[i] = round_to_bf16(args[i])
            self.handle.products[name] += 1
            return func(*args, **kwargs)
        if kind == "refused":
            raise RuntimeError(refusal(name))
        if kind == "unknown" and takes_float32_matrix(args, kwargs):
            self._report_unknown(func._schema.name)
        return func(*args, **kwargs)

    def _report_unknown(self, qualified: str) -> None:
        self.handle.unknown[qualified] += 1
        message = (f"tpu_default precision does not know {qualified}, which takes float32 tensors of rank "
                   ">= 2: any matrix products inside it run unrounded in float32. If it multiplies no "
                   "matrices add it to dalle_lab.numerics.op_kinds.PRODUCT_FREE_OPS; if it does, give it "
                   "to the mode as products it can see (or list it in op_kinds)")
        if self.unknown_ops == "raise":
            raise RuntimeError(message)
        if self.unknown_ops == "warn" and self.handle.unknown[qualified] == 1:
            warnings.warn(message, stacklevel=3)


def _attention_math(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """scaled_dot_product_attention written out in float32 ops (same semantics as torch's math reference)."""
    head_dim = query.shape[-1]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeat = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(repeat, dim=-3)
        value = value.repeat_interleave(repeat, dim=-3)
    logits = torch.matmul(query * scale, key.transpose(-2, -1))
    length_q, length_k = query.shape[-2], key.shape[-2]
    if is_causal:
        causal = torch.ones(length_q, length_k, dtype=torch.bool, device=query.device).tril()
        logits = logits.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            logits = logits.masked_fill(~attn_mask, float("-inf"))
        else:
            logits = logits + attn_mask
    weights = torch.softmax(logits, dim=-1)
    if dropout_p > 0.0:
        weights = torch.nn.functional.dropout(weights, p=dropout_p)
    return torch.matmul(weights, value)


# Backends whose float32 products may silently use a lower precision (TF32 on CUDA/cuDNN, bf16 or TF32 through oneDNN
# on CPU). torch >= 2.9 sets each one's `fp32_precision`; mixing that with the legacy allow_tf32 /
# set_float32_matmul_precision API makes torch raise, so the modes only use the new API when it exists.
_FP32_PRECISION_BACKENDS = ("cuda.matmul", "cudnn.conv", "cudnn.rnn", "mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn")


@contextlib.contextmanager
def _true_fp32():
    """Float32 products in full IEEE precision for the duration; each backend's previous setting comes back after."""
    backends = []
    for path in _FP32_PRECISION_BACKENDS:
        backend = torch.backends
        for part in path.split("."):
            backend = getattr(backend, part, None)
        if backend is not None and hasattr(backend, "fp32_precision"):
            backends.append(backend)
    if not backends:  # older torch: the legacy flags
        saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
        return
    saved = [(backend, backend.fp32_precision) for backend in backends]
    for backend in backends:
        backend.fp32_precision = "ieee"
    try:
        yield
    finally:
        for backend, value in saved:
            backend.fp32_precision = value


@contextlib.contextmanager
def _cast_model(model, dtype):
    """Run the model with every floating parameter and buffer (and floating forward input) cast to `dtype`.

    The casts are new tensors swapped in for the duration (torch's reparametrisation, what torch.func.functional_call
    uses); the model's own tensors are never touched. So a round trip loses nothing, and a graph recorded inside the
    block keeps the bfloat16 tensors it used: `loss.backward()` after the block (reward backpropagation through a
    bf16 reward model) sees the same dtypes as the forward did.
    """
    cast = {name: tensor.to(dtype)
            for name, tensor in [*model.named_parameters(remove_duplicate=False),
                                 *model.named_buffers(remove_duplicate=False)]
            if tensor.is_floating_point() and tensor.dtype != dtype}

    def cast_inputs(module, args, kwargs):
        def to_dtype(value):
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                return value.to(dtype)
            return value
        return tuple(to_dtype(a) for a in args), {k: to_dtype(v) for k, v in kwargs.items()}

    hook = model.register_forward_pre_hook(cast_inputs, with_kwargs=True)
    try:
        with _reparametrize_module(model, cast):
            yield
    finally:
        hook.remove()


@contextlib.contextmanager
def precision_mode(model, mode: str, unknown_ops: str = "warn"):
    """Run `model` (any torch nn.Module; None is allowed for fp32 and tpu_default) in precision `mode` in the block.

    Yields a PrecisionHandle; for tpu_default its `.products` counts the rounded products per aten op and `.unknown`
    the ops outside its allow-list that took float32 matrices (unknown_ops: "warn" once per op, "raise", or
    "ignore"; they are counted in every case). On exit the model's parameters, buffers and the global
    float32-precision settings are exactly what they were.
    """
    check_mode(mode)
    if unknown_ops not in ("warn", "raise", "ignore"):
        raise ValueError(f"unknown_ops must be 'warn', 'raise' or 'ignore', not {unknown_ops!r}")
    if model is None and mode in ("bf16", "fp16"):
        raise ValueError(f"precision mode {mode!r} casts a model's weights, so it needs the model (got None)")
    handle = PrecisionHandle(mode)
    dtype = {"fp32": torch.float32, "tpu_default": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[mode]
    with contextlib.ExitStack() as stack:
        if model is not None:
            stack.enter_context(_cast_model(model, dtype))
        if mode in ("fp32", "tpu_default"):
            stack.enter_context(_true_fp32())
        if mode == "tpu_default":
            stack.enter_context(_DecomposeAttention())
            stack.enter_context(_RoundProductOperands(handle, unknown_ops))
        yield handle


def count_matrix_products(model, *args, **kwargs) -> int:
    """Run `model(*args, **kwargs)` without gradients under tpu_default and return how many products it rounded."""
    with torch.no_grad(), precision_mode(model, "tpu_default") as handle:
        model(*args, **kwargs)
    return handle.num_products
