"""Precision modes (dalle_lab.numerics.modes): TPU-default emulation, interception counts, dtype casts and restores."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dalle_lab.numerics.modes import (PRECISION_MODES, count_matrix_products, precision_mode, round_to_bf16)


def bf16_round_reference(values: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest, ties to even) by bit manipulation, independent of torch."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    lsb = (bits >> 16) & 1
    rounded = ((bits + 0x7FFF + lsb) & 0xFFFF0000).astype(np.uint32)
    return rounded.view(np.float32)


def test_round_to_bf16_is_round_to_nearest_even():
    rng = np.random.default_rng(0)
    values = rng.standard_normal(10000).astype(np.float32) * 10.0 ** rng.integers(-5, 5, 10000)
    # exact ties: 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7 (rounds down to even 1.0);
    # 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6 (rounds up to even 1 + 2^-6)
    ties = np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, -(1 + 2.0 ** -8)], dtype=np.float32)
    values = np.concatenate([values, ties]).astype(np.float32)
    ours = round_to_bf16(torch.from_numpy(values)).numpy()
    np.testing.assert_array_equal(ours, bf16_round_reference(values))
    np.testing.assert_array_equal(ours[-3:], np.array([1.0, 1 + 2.0 ** -6, -1.0], dtype=np.float32))


def _bf16_reference(fn, *operands):
    """float64 result of `fn` on bf16-rounded operands: what a TPU computes, up to float32 summation order."""
    return fn(*[round_to_bf16(x).double() for x in operands])


def _accumulation_tolerance(fn, *operands):
    """Bound on float32 accumulation error: (terms + 2) * 2^-24 * the same product taken on absolute values."""
    terms = operands[0].shape[-1] if operands[0].dim() > 1 else operands[0].numel()
    magnitude = fn(*[round_to_bf16(x).double().abs() for x in operands])
    return (terms + 2) * 2.0 ** -24 * magnitude


PRODUCTS = {
    "matmul": (lambda a, b: a @ b, [(16, 96), (96, 24)]),
    "linear": (lambda a, b: F.linear(a, b), [(2, 5, 96), (24, 96)]),
    "bmm": (torch.bmm, [(3, 8, 96), (3, 96, 8)]),
    "einsum": (lambda a, b: torch.einsum("bij,bjk->bik", a, b), [(3, 8, 96), (3, 96, 8)]),
    "mv": (torch.mv, [(16, 96), (96,)]),
    "dot": (torch.dot, [(96,), (96,)]),
    "tensordot": (lambda a, b: torch.tensordot(a, b, dims=1), [(16, 96), (96, 8)]),
}


@pytest.mark.parametrize("name", sorted(PRODUCTS))
def test_tpu_default_products_match_bf16_operand_reference(name):
    fn, shapes = PRODUCTS[name]
    generator = torch.Generator().manual_seed(1)
    operands = [torch.randn(shape, generator=generator) for shape in shapes]
    with precision_mode(None, "tpu_default") as handle:
        emulated = fn(*operands)
    assert handle.num_products >= 1
    reference = _bf16_reference(fn, *operands)
    tolerance = _accumulation_tolerance(fn, *operands)
    assert emulated.dtype == torch.float32
    assert torch.all((emulated.double() - reference).abs() <= tolerance)
    # and it is not the plain float32 product: bf16 rounding moves results far beyond accumulation error
    plain = fn(*operands)
    assert (plain.double() - reference).abs().max() > 20 * tolerance.max()


def test_tpu_default_rounds_convolutions_and_fused_adds_but_not_biases():
    generator = torch.Generator().manual_seed(2)
    image, weight = torch.randn(2, 3, 12, 12, generator=generator), torch.randn(8, 3, 4, 4, generator=generator)
    bias = torch.randn(8, generator=generator) + 1e-3  # an unrounded bias: must be added exactly in float32
    with precision_mode(None, "tpu_default") as handle:
        conv = F.conv2d(image, weight, bias, stride=4)
    reference = F.conv2d(round_to_bf16(image).double(), round_to_bf16(weight).double(), bias.double(), stride=4)
    assert handle.products["convolution"] == 1
    assert (conv.double() - reference).abs().max() < 1e-5

    acc, a, b = torch.randn(3, 8, 8, generator=generator), torch.randn(3, 8, 64), torch.randn(3, 64, 8)
    with precision_mode(None, "tpu_default") as handle:
        fused = torch.baddbmm(acc, a, b)
    reference = acc.double() + torch.bmm(round_to_bf16(a).double(), round_to_bf16(b).double())
    assert handle.products["baddbmm"] == 1
    assert (fused.double() - reference).abs().max() < 1e-4


def test_tpu_default_attention_is_decomposed_with_float32_softmax():
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 10, 16, generator=generator) for _ in range(3))
    with precision_mode(None, "tpu_default") as handle:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert handle.num_products == 2  # q k^T and weights v

    scale = 16 ** -0.5
    logits = round_to_bf16(q * scale).double() @ round_to_bf16(k).double().transpose(-2, -1)
    logits = logits.masked_fill(~torch.ones(10, 10, dtype=torch.bool).tril(), float("-inf"))
    weights = torch.softmax(logits.float(), dim=-1)  # float32 softmax, then its output rounded as the next operand
    reference = round_to_bf16(weights).double() @ round_to_bf16(v).double()
    assert (out.double() - reference).abs().max() < 1e-5
    assert (out - F.scaled_dot_product_attention(q, k, v, is_causal=True)).abs().max() > 1e-4


def test_tpu_default_refuses_fused_kernels_it_cannot_see_into():
    q = k = v = torch.randn(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="aten::_scaled_dot_product_flash_attention_for_cpu, which multiplies"):
        with precision_mode(None, "tpu_default"):
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)


def _tiny_clip(attn_implementation="sdpa", layers=3):
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    config = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=2,
                              image_size=32, patch_size=8, projection_dim=16)
    torch.manual_seed(0)
    return CLIPVisionModelWithProjection._from_config(config, attn_implementation=attn_implementation).eval()


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_tpu_default_intercepts_every_product_of_a_tiny_clip(attn_implementation):
    model = _tiny_clip(attn_implementation)
    layers = model.config.num_hidden_layers
    # per layer: q, k, v, out projections, fc1, fc2 and the two attention products; plus the patch-embedding
    # convolution and the visual projection
    known = 8 * layers + 2
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    convs = sum(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    assert linears + convs + 2 * layers == known
    assert count_matrix_products(model, pixel_values=torch.rand(2, 3, 32, 32)) == known


def test_tpu_default_gives_the_same_clip_embeddings_through_fused_and_eager_attention():
    # the same weights: sdpa (decomposed by the mode, query scaled first, as in Flax) and eager (scaled after the
    # product); with a power-of-two scale the rounded products agree exactly, so only summation order differs
    sdpa, eager = _tiny_clip("sdpa"), _tiny_clip("eager")
    pixels = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        exact = sdpa(pixel_values=pixels).image_embeds
        with precision_mode(None, "tpu_default"):
            through_sdpa = sdpa(pixel_values=pixels).image_embeds
            through_eager = eager(pixel_values=pixels).image_embeds
    emulation_gap = (through_sdpa - through_eager).abs().max()
    assert emulation_gap < 1e-5
    assert (through_sdpa - exact).abs().max() > 20 * emulation_gap


def test_tpu_default_changes_clip_embeddings_a_little_and_gradients_still_flow():
    model = _tiny_clip()
    pixels = torch.rand(2, 3, 32, 32, requires_grad=True)
    exact = model(pixel_values=pixels).image_embeds
    with precision_mode(model, "tpu_default"):
        emulated = model(pixel_values=pixels).image_embeds
        emulated.sum().backward()
    cosine = F.cosine_similarity(exact, emulated)
    assert torch.all(cosine > 0.99) and not torch.equal(exact, emulated)
    assert pixels.grad is not None and pixels.grad.abs().sum() > 0


@pytest.mark.parametrize("mode,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_low_precision_modes_cast_model_and_inputs_then_restore_exactly(mode, dtype):
    model = _tiny_clip(layers=1)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    pixels = torch.rand(2, 3, 32, 32)
    with torch.no_grad(), precision_mode(model, mode):
        assert all(p.dtype == dtype for p in model.parameters())
        out = model(pixel_values=pixels).image_embeds
    assert out.dtype == dtype
    after = model.state_dict()
    for name, tensor in before.items():
        assert after[name].dtype == tensor.dtype and torch.equal(after[name], tensor), name
    # a plain module whose forward does not cast its inputs itself: the mode casts them
    linear = torch.nn.Linear(4, 2)
    with torch.no_grad(), precision_mode(linear, mode):
        assert linear(torch.randn(3, 4)).dtype == dtype
    assert linear.weight.dtype == torch.float32


def test_fp32_mode_restores_a_bf16_model_and_switches_tf32_off_temporarily():
    linear = torch.nn.Linear(4, 2).bfloat16()
    cuda_matmul, onednn_matmul = torch.backends.cuda.matmul, torch.backends.mkldnn.matmul
    saved = (cuda_matmul.fp32_precision, onednn_matmul.fp32_precision)
    cuda_matmul.fp32_precision, onednn_matmul.fp32_precision = "tf32", "bf16"  # what a user may have set
    try:
        with precision_mode(linear, "fp32"), torch.no_grad():
            assert linear.weight.dtype == torch.float32
            assert (cuda_matmul.fp32_precision, onednn_matmul.fp32_precision) == ("ieee", "ieee")
            assert linear(torch.randn(3, 4)).dtype == torch.float32
        assert (cuda_matmul.fp32_precision, onednn_matmul.fp32_precision) == ("tf32", "bf16")
    finally:
        cuda_matmul.fp32_precision, onednn_matmul.fp32_precision = saved
    assert linear.weight.dtype == torch.bfloat16
    torch.get_float32_matmul_precision()  # the settings are consistent again (torch raises on a mix)


def test_unknown_mode_and_missing_model_are_clear_errors():
    with pytest.raises(ValueError, match="unknown precision mode"):
        with precision_mode(torch.nn.Linear(2, 2), "tf32"):
            pass
    with pytest.raises(ValueError, match="needs the model"):
        with precision_mode(None, "bf16"):
            pass
    assert set(PRECISION_MODES) == {"fp32", "bf16", "fp16", "tpu_default"}


# ------------------------------------------------------------------ issue 14: an allow-list, never a silent skip

def test_tpu_default_refuses_cdist_and_names_it():
    with pytest.raises(RuntimeError, match="aten::_cdist_forward"):
        with precision_mode(None, "tpu_default"):
            torch.cdist(torch.randn(5, 16), torch.randn(7, 16))


def test_tpu_default_rounds_the_outer_product_of_addr():
    generator = torch.Generator().manual_seed(3)
    m, a, b = (torch.randn(shape, generator=generator) for shape in [(6, 5), (6,), (5,)])
    with precision_mode(None, "tpu_default") as handle:
        out = torch.addr(m, a, b)
    assert handle.products["addr"] == 1
    reference = m.double() + torch.outer(round_to_bf16(a).double(), round_to_bf16(b).double())
    assert (out.double() - reference).abs().max() < 1e-6
    assert (torch.addr(m, a, b).double() - reference).abs().max() > 1e-4  # the rounding is visible


@torch.library.custom_op("dalle_lab_test::hidden_matmul", mutates_args=())
def _hidden_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A custom op, registered the way flash-attn and xformers register theirs, that hides a product."""
    return a @ b


@_hidden_matmul.register_fake
def _(a, b):
    return a.new_empty(a.shape[0], b.shape[1])


def test_tpu_default_reports_ops_outside_its_allow_list_by_name():
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with pytest.warns(UserWarning, match="dalle_lab_test::hidden_matmul"):
        with precision_mode(None, "tpu_default") as handle:
            _hidden_matmul(a, b)
            _hidden_matmul(a, b)
    assert handle.unknown["dalle_lab_test::hidden_matmul"] == 2 and handle.num_products == 0
    table, index = torch.randn(10, 8), torch.tensor([[1, 2], [3, 4]])
    with pytest.raises(RuntimeError, match="aten::_embedding_bag"):  # an unlisted aten op, refused on request
        with precision_mode(None, "tpu_default", unknown_ops="raise"):
            F.embedding_bag(index, table, per_sample_weights=torch.rand(2, 2), mode="sum")
    with precision_mode(None, "tpu_default", unknown_ops="ignore") as handle:  # counted even when quiet
        _hidden_matmul(a, b)
        (a * 2).softmax(-1).sum()  # allow-listed: pointwise, softmax, reduction
    assert dict(handle.unknown) == {"dalle_lab_test::hidden_matmul": 1}


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_tpu_default_clip_tower_matches_a_float64_reference_of_bf16_operands(attn_implementation):
    """End to end: the whole tiny CLIP vision tower under tpu_default against the same forward written out by hand
    (dalle_lab.numerics.reference) with bf16-rounded operands and float64 sums."""
    from dalle_lab.numerics.reference import clip_vision_reference

    model = _tiny_clip(attn_implementation)
    pixels = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        exact = model(pixel_values=pixels).image_embeds.double()
        with precision_mode(model, "tpu_default", unknown_ops="raise") as handle:
            emulated = model(pixel_values=pixels).image_embeds.double()
    reference = clip_vision_reference(model, pixels)
    emulation_gap = (emulated - reference).abs().max()
    assert emulation_gap < 1e-5  # measured 1.5e-7: float32 summation error
    assert (exact - reference).abs().max() > 100 * emulation_gap  # measured 6.7e-3: what the rounding does
    # the reference itself is right: without rounding it is the float32 model to float32 error
    assert (clip_vision_reference(model, pixels, round_products=False) - exact).abs().max() < 1e-5
    assert handle.num_products == 8 * model.config.num_hidden_layers + 2 and not handle.unknown


@pytest.mark.parametrize("name,call,shapes", [
    ("addmm_", lambda c, a, b: c.addmm_(a, b), [(6, 5), (6, 96), (96, 5)]),
    ("baddbmm_", lambda c, a, b: c.baddbmm_(a, b), [(2, 6, 5), (2, 6, 96), (2, 96, 5)]),
    ("addbmm_", lambda c, a, b: c.addbmm_(a, b), [(6, 5), (2, 6, 96), (2, 96, 5)]),
    ("addmv_", lambda c, a, b: c.addmv_(a, b), [(6,), (6, 96), (96,)]),
    ("addr_", lambda c, a, b: c.addr_(a, b), [(6, 5), (6,), (5,)]),
])
def test_tpu_default_rounds_in_place_products(name, call, shapes):
    """Tensor.addmm_ and friends dispatch under their own names: they are products too (they once ran unrounded,
    only reported as unknown)."""
    generator = torch.Generator().manual_seed(4)
    c, a, b = (torch.randn(shape, generator=generator) for shape in shapes)
    with precision_mode(None, "tpu_default", unknown_ops="raise") as handle:
        out = call(c.clone(), a, b)
    assert handle.products[name] == 1
    reference = call(c.double(), round_to_bf16(a).double(), round_to_bf16(b).double())
    assert (out.double() - reference).abs().max() < 1e-5
    assert (call(c.clone(), a, b).double() - reference).abs().max() > 1e-4  # the rounding is visible


def test_tpu_default_refuses_linear_algebra_naming_the_op():
    matrix = torch.eye(4) + 0.1 * torch.randn(4, 4, generator=torch.Generator().manual_seed(5))
    with pytest.raises(RuntimeError, match="aten::_linalg_solve_ex, which multiplies .* outside the tpu_default"):
        with precision_mode(None, "tpu_default"):
            torch.linalg.solve(matrix, torch.ones(4, 2))


def test_every_aten_op_that_may_multiply_matrices_is_rounded_refused_or_known_free():
    """Every aten op this torch registers whose name says it may multiply matrices, and that is not decomposed
    before the dispatch mode sees it (CompositeImplicitAutograd), is classified by op_kinds: a kernel a newer torch
    adds fails here until it is rounded, refused or known to multiply nothing."""
    import re

    from dalle_lab.numerics.op_kinds import op_kind

    maybe_product = re.compile(r"mm|matmul|conv|attention|rnn|lstm|gru|linalg|cholesky|solve|bilinear|dot|mv|addr|"
                               r"svd|eig|qr|lstsq|inverse|det|ormqr|geqrf|householder|matrix_exp|dist|trilinear|"
                               r"transformer|multi_head|linear")
    names = sorted({n.split("::", 1)[1].split(".")[0] for n in torch._C._dispatch_get_all_op_names()
                    if n.startswith("aten::")})
    unclassified, checked = [], 0
    for name in filter(maybe_product.search, names):
        packet = getattr(torch.ops.aten, name, None)
        if packet is None or not packet.overloads():
            continue
        op = getattr(packet, packet.overloads()[0])
        if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), torch._C.DispatchKey.CompositeImplicitAutograd):
            continue
        checked += 1
        if op_kind(op) == "unknown":
            unclassified.append(name)
    assert checked > 150 and not unclassified, unclassified  # 204 in torch 2.13


def test_numerics_is_a_leaf_that_imports_nothing_else_of_the_package():
    """rewards, align and the parity reports build on numerics; an import back up would tie the leaf to them."""
    import subprocess
    import sys

    # what `import dalle_lab` itself loads (its lazy-export helper) is the package root's, not numerics' doing
    code = ("import sys, dalle_lab; root = set(sys.modules); import dalle_lab.numerics, dalle_lab.numerics.reference; "
            "print(sorted(m for m in set(sys.modules) - root if m.startswith('dalle_lab.') "
            "and not m.startswith('dalle_lab.numerics')))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "[]"
