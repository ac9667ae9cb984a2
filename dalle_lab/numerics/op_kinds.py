"""Which aten ops multiply float32 matrices: the tables behind tpu_default (modes.py), in one place.

Every op the dispatch mode sees is one of
- "product": a matrix product whose operands the mode can reach; it rounds them to bfloat16 (PRODUCT_OPERANDS);
- "refused": a kernel that multiplies matrices inside where the operands cannot be reached (fused attention, RNN and
  backend convolution kernels, sparse / quantised / grouped products, linear-algebra routines); the mode raises an
  error naming it (HIDDEN_PRODUCT_KERNELS, LINALG_OPS);
- "free": known to multiply no matrices (PRODUCT_FREE_OPS, every op tagged pointwise, every view); run untouched;
- "unknown": anything else (an aten op none of the lists names, any custom op registered through torch.library the
  way flash-attn and xformers register theirs); the mode reports it when it takes a float32 tensor of rank >= 2.
tests/test_numerics.py scans every aten op this torch registers whose name says it may multiply matrices (mm,
conv, attention, rnn, linalg, solve, ...) and fails on any that is neither "product", "refused" nor "free", so a
kernel added by a newer torch is classified here before the mode can skip it.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_leaves

# products whose float32 operands tpu_default rounds: op name -> positions of the multiplied operands. Bias and
# accumulator inputs (addmm's first argument, a conv bias) are added in float32 and left alone, as on a TPU. The
# in-place forms (Tensor.addmm_ and friends) dispatch under their own names.
PRODUCT_OPERANDS = {
    "mm": (0, 1),
    "bmm": (0, 1),
    "mv": (0, 1),
    "dot": (0, 1),
    "vdot": (0, 1),
    "addmm": (1, 2),
    "addmm_": (1, 2),
    "_addmm_activation": (1, 2),
    "baddbmm": (1, 2),
    "baddbmm_": (1, 2),
    "addbmm": (1, 2),
    "addbmm_": (1, 2),
    "addmv": (1, 2),
    "addmv_": (1, 2),
    "addr": (1, 2),  # outer product of two vectors added to a matrix (BLAS ger): a rank-1 matrix product
    "addr_": (1, 2),
    "convolution": (0, 1),
    "_convolution": (0, 1),
    "convolution_backward": (0, 1, 2),  # grad_output, input, weight: the backward products of a convolution
}

# Kernels that multiply matrices inside one call, where the mode cannot round the operands.
HIDDEN_PRODUCT_KERNELS = frozenset("""
    _scaled_dot_product_flash_attention _scaled_dot_product_flash_attention_for_cpu
    _scaled_dot_product_efficient_attention _scaled_dot_product_cudnn_attention
    _scaled_dot_product_fused_attention_overrideable _scaled_dot_product_attention_math_for_mps
    _flash_attention_forward _flash_attention_forward_no_dropout_inplace _efficient_attention_forward
    _cudnn_attention_forward _native_multi_head_attention _transformer_encoder_layer_fwd
    _triton_multi_head_attention _triton_scaled_dot_attention
    _scaled_dot_product_flash_attention_for_cpu_backward _scaled_dot_product_flash_attention_backward
    _scaled_dot_product_efficient_attention_backward _scaled_dot_product_cudnn_attention_backward
    _scaled_dot_product_fused_attention_overrideable_backward _flash_attention_backward _efficient_attention_backward
    _cudnn_attention_backward
    mkldnn_rnn_layer mkldnn_rnn_layer_backward _thnn_fused_lstm_cell _thnn_fused_lstm_cell_backward_impl
    _thnn_fused_gru_cell _thnn_fused_gru_cell_backward _cudnn_rnn _cudnn_rnn_backward miopen_rnn miopen_rnn_backward
    quantized_lstm quantized_gru _lstm_mps lstm_mps_backward
    _trilinear mkldnn_linear mkldnn_linear_backward mkldnn_linear_backward_input mkldnn_linear_backward_weights
    linear_backward matmul_backward _mixed_dtypes_linear
    mkldnn_convolution slow_conv2d_forward _slow_conv2d_forward _slow_conv2d_backward slow_conv3d_forward
    slow_conv_transpose2d slow_conv_transpose3d slow_conv_dilated2d slow_conv_dilated3d thnn_conv2d
    _conv_depthwise2d conv_depthwise3d conv_tbc _nnpack_spatial_convolution cudnn_convolution
    cudnn_convolution_transpose cudnn_convolution_relu cudnn_convolution_add_relu miopen_convolution
    miopen_convolution_transpose miopen_depthwise_convolution miopen_convolution_relu miopen_convolution_add_relu
    _mps_convolution _mps_convolution_transpose mps_convolution_backward mps_convolution_transpose_backward
    convolution_overrideable convolution_backward_overrideable
    _cdist_forward _cdist_backward _euclidean_dist _pdist_forward _pdist_backward
    _int_mm _scaled_mm _scaled_mm_v2 _grouped_mm _scaled_grouped_mm _scaled_grouped_mm_v2 _foreach_mm
    _weight_int8pack_mm _weight_int4pack_mm _weight_int4pack_mm_for_cpu _weight_int4pack_mm_with_scales_and_zeros
    _dyn_quant_matmul_4bit _compute_linear_combination
    _sparse_addmm _sparse_mm_reduce_impl _sparse_mm_reduce_impl_backward _sparse_sparse_matmul sspaddmm hspmm
    sparse_sampled_addmm _sparse_semi_structured_addmm _sparse_semi_structured_linear _sparse_semi_structured_mm
    _cslt_sparse_mm _cslt_sparse_mm_search _embedding_bag_per_sample_weights_backward
""".split())

# Linear-algebra routines: blocked algorithms built on matrix products. How a TPU's compiler would round the products
# inside them is not emulated, so they are refused rather than run in float32.
LINALG_OPS = frozenset("""
    linalg_inv_ex _linalg_solve_ex linalg_solve_triangular triangular_solve linalg_lu linalg_lu_factor_ex
    linalg_lu_solve linalg_ldl_factor_ex linalg_ldl_solve linalg_cholesky_ex cholesky cholesky_inverse cholesky_solve
    _cholesky_solve_helper linalg_qr geqrf ormqr linalg_householder_product _linalg_svd _linalg_eigh linalg_eig
    _linalg_eigvals _linalg_det _linalg_slogdet linalg_lstsq linalg_matrix_exp _spsolve
""".split())

# The allow-list: aten ops known to multiply no matrices, so tpu_default runs them untouched in float32. Together with
# every op tagged pointwise (add, mul, gelu, exp, where, ...) and every view (view, transpose, expand, slice, ...).
PRODUCT_FREE_OPS = frozenset("""
    _softmax _softmax_backward_data _log_softmax _log_softmax_backward_data logsumexp
    native_layer_norm native_layer_norm_backward native_group_norm native_group_norm_backward native_batch_norm
    native_batch_norm_backward _native_batch_norm_legit _native_batch_norm_legit_no_training
    _native_batch_norm_legit_functional _fused_rms_norm _fused_rms_norm_backward
    embedding embedding_dense_backward index index_select index_put index_put_ index_add index_add_ index_copy
    gather scatter scatter_ scatter_add scatter_add_ scatter_reduce masked_fill masked_fill_ masked_scatter
    masked_select take put_ nonzero
    sum mean amax amin max min argmax argmin var var_mean std std_mean norm linalg_vector_norm prod cumsum cumprod
    cummax cummin _cummax_helper _cummin_helper dist linalg__powsum
    any all sort topk kthvalue median mode count_nonzero
    cat stack split split_with_sizes unbind chunk clone copy_ _to_copy _copy_from _copy_from_and_resize contiguous
    _unsafe_view empty_like zeros_like ones_like full_like rand_like randn_like new_empty new_empty_strided new_zeros
    new_ones new_full fill_ zero_ empty empty_strided zeros ones full arange rand randn randint bernoulli bernoulli_
    native_dropout native_dropout_backward uniform_ normal_ exponential_ _standard_gamma _standard_gamma_grad
    hamming_window
    constant_pad_nd reflection_pad1d reflection_pad2d reflection_pad3d replication_pad1d replication_pad2d
    replication_pad3d reflection_pad2d_backward replication_pad2d_backward
    repeat repeat_interleave roll flip tril triu tril_ triu_ select_backward slice_backward diagonal_backward
    expand_copy permute_copy view_copy _reshape_copy detach_copy
    avg_pool2d avg_pool2d_backward max_pool2d_with_indices max_pool2d_with_indices_backward adaptive_avg_pool2d
    _adaptive_avg_pool2d _adaptive_avg_pool2d_backward adaptive_max_pool2d adaptive_max_pool2d_backward
    avg_pool1d avg_pool3d max_pool3d_with_indices
    im2col col2im pixel_shuffle pixel_unshuffle channel_shuffle
    upsample_nearest1d upsample_nearest2d upsample_nearest3d _upsample_nearest_exact2d upsample_bilinear2d
    upsample_bicubic2d upsample_linear1d upsample_trilinear3d _upsample_bilinear2d_aa _upsample_bicubic2d_aa
    upsample_nearest2d_backward upsample_bilinear2d_backward upsample_bicubic2d_backward upsample_linear1d_backward
    upsample_trilinear3d_backward _upsample_bicubic2d_aa_backward _upsample_bilinear2d_aa_backward grid_sampler_2d
    grid_sampler_2d_backward
    mse_loss mse_loss_backward l1_loss smooth_l1_loss smooth_l1_loss_backward huber_loss huber_loss_backward
    nll_loss_forward nll_loss_backward nll_loss2d_forward nll_loss2d_backward binary_cross_entropy
    binary_cross_entropy_backward binary_cross_entropy_with_logits
    _local_scalar_dense equal allclose isclose isnan isinf isfinite is_nonzero histc bincount unique_dim
    _unique2 searchsorted bucketize linalg_cross _weight_norm_interface _weight_norm_interface_backward
    lift_fresh lift_fresh_copy set_ resize_ as_strided_ detach_ alias_copy _foreach_add _foreach_mul
    _foreach_sqrt _foreach_sqrt_ _foreach_rsqrt _foreach_rsqrt_ _foreach_lgamma _foreach_lgamma_
    _linalg_check_errors _convert_indices_from_coo_to_csr _convert_indices_from_csr_to_coo _cudnn_rnn_flatten_weight
    mkldnn_reorder_conv2d_weight mkldnn_reorder_conv3d_weight _convert_weight_to_int4pack
    _convert_weight_to_int4pack_for_cpu _dyn_quant_pack_4bit_weight _nested_get_jagged_dummy
""".split())


def op_kind(func) -> str:
    """'product' (rounded), 'refused', 'free' (multiplies no matrices) or 'unknown', for an OpOverload."""
    namespace, _, name = func._schema.name.partition("::")
    if namespace != "aten":
        return "unknown"
    if name in PRODUCT_OPERANDS:
        return "product"
    if name in HIDDEN_PRODUCT_KERNELS or name in LINALG_OPS:
        return "refused"
    if name in PRODUCT_FREE_OPS or func.is_view or torch.Tag.pointwise in func.tags:
        return "free"
    return "unknown"


def refusal(name: str) -> str:
    """The one-line error for a refused op: what it is and what to do instead."""
    if name in LINALG_OPS:
        fix = ("a linear-algebra routine (solve, inverse, a decomposition) whose internal products a TPU's compiler "
               "rounds in its own way, not emulated here: compute it outside the tpu_default block")
    else:
        fix = ("run the model with its unfused path (for HuggingFace models attn_implementation='eager' or 'sdpa'; "
               "for nn.MultiheadAttention / nn.TransformerEncoderLayer call it with need_weights=True or in training "
               "mode; torch.cdist: write the distances with matmul) so every product is visible")
    return (f"tpu_default precision reached aten::{name}, which multiplies matrices inside one kernel where it cannot "
            f"round the operands: {fix}")


def takes_float32_matrix(args, kwargs) -> bool:
    """Whether any tensor among an op's arguments is a float32 matrix (rank >= 2): what an unknown op must not touch
    unseen."""
    return any(isinstance(x, torch.Tensor) and x.dtype == torch.float32 and x.dim() >= 2
               for x in tree_leaves((args, kwargs)))
