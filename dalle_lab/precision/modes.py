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
  float32. It works on aten ops (a TorchDispatchMode), so it reaches products however a model spells them; fused
  kernels that hide products inside (fused attention, RNN kernels, cdist) are either decomposed
  (scaled_dot_product_attention) or refused with an error naming the op. Every other op is checked against an
  allow-list of ops that multiply no matrices; one outside it that takes a float32 matrix (an unlisted aten op, a
  custom op from torch.library) is reported by name, never silently skipped. Gradients pass straight through the
  rounding.

The tpu_default rounding applies to every product computed inside the `with` block (on a TPU it is global too), not
only the model's: a reward's head and preprocessing run under it as well.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field

PRECISION_MODES = ("fp32", "bf16", "fp16", "tpu_default")

# aten products whose float32 operands tpu_default rounds: op name -> positions of the multiplied operands.
# Bias / accumulator inputs (addmm's first argument, a conv bias) are added in float32 and left alone, as on a TPU.
_PRODUCT_OPERANDS = {
    "mm": (0, 1),
    "bmm": (0, 1),
    "mv": (0, 1),
    "dot": (0, 1),
    "vdot": (0, 1),
    "addmm": (1, 2),
    "_addmm_activation": (1, 2),
    "baddbmm": (1, 2),
    "addbmm": (1, 2),
    "addmv": (1, 2),
    "convolution": (0, 1),
    "_convolution": (0, 1),
    "convolution_backward": (0, 1, 2),  # grad_output, input, weight: the backward products of a convolution
    "addr": (1, 2),  # outer product of two vectors added to a matrix (BLAS ger): a rank-1 matrix product
}

# Fused aten kernels that multiply matrices internally where the mode cannot reach the operands. Reaching one inside
# tpu_default raises instead of silently computing full-precision products.
_FUSED_PRODUCT_OPS = (
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
    "_flash_attention_forward",
    "_efficient_attention_forward",
    "_native_multi_head_attention",
    "_transformer_encoder_layer_fwd",
    "_trilinear",
    "mkldnn_rnn_layer",
    "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell",
    "mkldnn_linear",
    "mkldnn_convolution",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention_backward",
    "_cdist_forward",  # torch.cdist: p=2 distances go through a hidden matrix product
    "_cdist_backward",
    "_euclidean_dist",
    "_pdist_forward",
    "_pdist_backward",
    "_int_mm",
    "_scaled_mm",
    "_weight_int8pack_mm",
    "_weight_int4pack_mm",
    "slow_conv2d_forward",
    "_slow_conv2d_forward",
    "slow_conv3d_forward",
    "slow_conv_transpose2d",
    "slow_conv_transpose3d",
    "thnn_conv2d",
    "_conv_depthwise2d",
    "conv_depthwise3d",
    "cudnn_convolution",
    "cudnn_convolution_transpose",
    "miopen_convolution",
)

# The allow-list: aten ops known to multiply no matrices, so tpu_default runs them untouched in float32. Together with
# every op tagged pointwise (add, mul, gelu, exp, where, ...) and every view (view, transpose, expand, slice, ...).
# Any other op that takes a float32 tensor of rank >= 2 (an aten op not listed, or a custom op registered through
# torch.library, the way flash-attn and xformers register theirs) is reported: counted in PrecisionHandle.unknown
# and warned about (or refused, with unknown_ops="raise"), because it might hide products the mode cannot round.
_PRODUCT_FREE_OPS = frozenset("""
    _softmax _softmax_backward_data _log_softmax _log_softmax_backward_data logsumexp
    native_layer_norm native_layer_norm_backward native_group_norm native_group_norm_backward native_batch_norm
    native_batch_norm_backward _native_batch_norm_legit _native_batch_norm_legit_no_training
    _native_batch_norm_legit_functional _fused_rms_norm _fused_rms_norm_backward
    embedding embedding_dense_backward index index_select index_put index_put_ index_add index_add_ index_copy
    gather scatter scatter_ scatter_add scatter_add_ scatter_reduce masked_fill masked_fill_ masked_scatter
    masked_select take put_ nonzero
    sum mean amax amin max min argmax argmin var var_mean std std_mean norm linalg_vector_norm prod cumsum cumprod
    any all sort topk kthvalue median mode count_nonzero
    cat stack split split_with_sizes unbind chunk clone copy_ _to_copy _copy_from _copy_from_and_resize contiguous
    _unsafe_view empty_like zeros_like ones_like full_like rand_like randn_like new_empty new_empty_strided new_zeros
    new_ones new_full fill_ zero_ empty empty_strided zeros ones full arange rand randn randint bernoulli bernoulli_
    native_dropout native_dropout_backward uniform_ normal_ exponential_
    constant_pad_nd reflection_pad1d reflection_pad2d reflection_pad3d replication_pad1d replication_pad2d
    replication_pad3d reflection_pad2d_backward replication_pad2d_backward
    repeat repeat_interleave roll flip tril triu tril_ triu_ select_backward slice_backward diagonal_backward
    expand_copy permute_copy view_copy _reshape_copy
    avg_pool2d avg_pool2d_backward max_pool2d_with_indices max_pool2d_with_indices_backward adaptive_avg_pool2d
    _adaptive_avg_pool2d _adaptive_avg_pool2d_backward adaptive_max_pool2d adaptive_max_pool2d_backward
    avg_pool1d avg_pool3d max_pool3d_with_indices
    im2col col2im pixel_shuffle pixel_unshuffle channel_shuffle
    upsample_nearest1d upsample_nearest2d upsample_nearest3d _upsample_nearest_exact2d upsample_bilinear2d
    upsample_bicubic2d upsample_linear1d upsample_trilinear3d _upsample_bilinear2d_aa _upsample_bicubic2d_aa
    upsample_nearest2d_backward upsample_bilinear2d_backward upsample_bicubic2d_backward
    _upsample_bicubic2d_aa_backward _upsample_bilinear2d_aa_backward grid_sampler_2d grid_sampler_2d_backward
    mse_loss mse_loss_backward l1_loss smooth_l1_loss smooth_l1_loss_backward huber_loss huber_loss_backward
    nll_loss_forward nll_loss_backward nll_loss2d_forward nll_loss2d_backward binary_cross_entropy
    binary_cross_entropy_backward binary_cross_entropy_with_logits
    _local_scalar_dense equal allclose isclose isnan isinf isfinite is_nonzero histc bincount unique_dim
    _unique2 searchsorted bucketize linalg_cross _weight_norm_interface _weight_norm_interface_backward
    lift_fresh lift_fresh_copy set_ resize_ as_strided_ detach_ alias_copy _foreach_add _foreach_mul
""".split())


def check_mode(mode: str) -> str:
    if mode not in PRECISION_MODES:
        raise ValueError(f"unknown precision mode {mode!r}; choose one of {', '.join(PRECISION_MODES)}")
    return mode


def round_to_bf16(tensor):
    """Round a float32 tensor to the nearest bfloat16 value (ties to even), returned as float32.

    torch's float32 -> bfloat16 conversion rounds to nearest even; casting back is exact.
    """
    import torch

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


def _takes_float32_matrix(args, kwargs) -> bool:
    import torch
    from torch.utils._pytree import tree_leaves

    return any(isinstance(x, torch.Tensor) and x.dtype == torch.float32 and x.dim() >= 2
               for x in tree_leaves((args, kwargs)))


def _op_kind(func) -> str:
    """'product' (rounded), 'fused' (refused), 'free' (allow-listed: multiplies no matrices) or 'unknown'."""
    import torch

    namespace, _, name = func._schema.name.partition("::")
    if namespace != "aten":
        return "unknown"
    if name in _PRODUCT_OPERANDS:
        return "product"
    if name in _FUSED_PRODUCT_OPS:
        return "fused"
    if name in _PRODUCT_FREE_OPS or func.is_view or torch.Tag.pointwise in func.tags:
        return "free"
    return "unknown"


def _tpu_default_modes(handle: PrecisionHandle, unknown_ops: str = "warn"):
    """Build the two torch modes behind tpu_default (imported lazily: torch internals)."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class DecomposeAttention(TorchFunctionMode):
        """Rewrites scaled_dot_product_attention as two matmuls and a float32 softmax, which the dispatch mode rounds.

        As in Flax's dot_product_attention (what the TPU run used), the query is scaled before the first product.
        """

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.scaled_dot_product_attention:
                return _attention_math(*args, **kwargs)
            return func(*args, **kwargs)

    kinds: dict = {}  # op -> kind, classified once per op

    class RoundProductOperands(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            kind = kinds.get(func)
            if kind is None:
                kind = kinds[func] = _op_kind(func)
            if kind == "free":
                return func(*args, **kwargs)
            name = func._schema.name.split("::", 1)[-1]
            operands = _PRODUCT_OPERANDS.get(name) if kind == "product" else None
            if operands is not None and any(
                    i < len(args) and isinstance(args[i], torch.Tensor) and args[i].dtype == torch.float32
                    for i in operands):
                args = list(args)
                for i in operands:
                    if i < len(args) and isinstance(args[i], torch.Tensor):
                        args[i] = round_to_bf16(args[i])
                handle.products[name] += 1
                return func(*args, **kwargs)
            if kind == "fused":
                raise RuntimeError(
                    f"tpu_default precision reached the fused kernel aten::{name}, whose internal matrix products it "
                    "cannot round. Run the model with its unfused path (for HuggingFace models "
                    "attn_implementation='eager' or 'sdpa'; for nn.MultiheadAttention / nn.TransformerEncoderLayer "
                    "call it with need_weights=True or in training mode; torch.cdist: write the distances with "
                    "matmul) so every product is visible.")
            if kind == "unknown" and _takes_float32_matrix(args, kwargs):
                qualified = func._schema.name
                handle.unknown[qualified] += 1
                message = (f"tpu_default precision does not know {qualified}, which takes float32 tensors of rank "
                           ">= 2: any matrix products inside it run unrounded in float32. If it multiplies no "
                           "matrices add it to dalle_lab.precision.modes._PRODUCT_FREE_OPS; if it does, give it "
                           "to the mode as products it can see (or add it to _PRODUCT_OPERANDS)")
                if unknown_ops == "raise":
                    raise RuntimeError(message)
                if unknown_ops == "warn" and handle.unknown[qualified] == 1:
                    import warnings

                    warnings.warn(message, stacklevel=2)
            return func(*args, **kwargs)

    return DecomposeAttention(), RoundProductOperands()


def _attention_math(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """scaled_dot_product_attention written out in float32 ops (same semantics as torch's math reference)."""
    import math

    import torch

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
    import torch

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
    import torch
    from torch.nn.utils.stateless import _reparametrize_module

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
    import torch

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
            decompose, round_products = _tpu_default_modes(handle, unknown_ops)
            stack.enter_context(decompose)
            stack.enter_context(round_products)
        yield handle


def count_matrix_products(model, *args, **kwargs) -> int:
    """Run `model(*args, **kwargs)` without gradients under tpu_default and return how many products it rounded."""
    import torch

    with torch.no_grad(), precision_mode(model, "tpu_default") as handle:
        model(*args, **kwargs)
    return handle.num_products
