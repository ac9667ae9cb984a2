"""Fast decoding paths give the same tokens as the plain cached path: packed weights, the static cache (the
CUDA-graph layout: fixed-length attention with a position mask), and bfloat16 packing bit for bit."""
import pytest
import torch
import torch.nn.functional as F

from dalle_lab.model.decoding import Decoder, Sampling, plain_decode
from dalle_lab.model import linear
from dalle_lab.model.linear import Linear, packed_linears, packing_available

from tiny_models import opinionated_dalle

needs_packing = pytest.mark.skipif(not packing_available(), reason="this torch build has no MKL / oneDNN")


def decode(model, text, seed=0, sampling=Sampling(temperature=0.9, top_k=8), **kw):
    tokens = torch.zeros(text.shape[0], model.config.image_seq_len, dtype=torch.long)
    logprobs = torch.zeros(tokens.shape)
    with torch.no_grad():
        plain_decode(model, model._text_ids(text), tokens, logprobs, 0, sampling, torch.Generator().manual_seed(seed),
                     **kw)
    return tokens, logprobs


TEXT = torch.tensor([[3, 9, 4, 0, 0], [7, 1, 0, 0, 0], [2, 2, 2, 2, 2]])


@pytest.mark.parametrize("sampling", [Sampling(temperature=0.9, top_k=8), Sampling(cond_scale=3.0, top_p=0.9)])
@pytest.mark.parametrize("variant", [dict(prepack=True), dict(static=True, prepack=False),
                                     dict(static=True, prepack=True)])
def test_fast_paths_give_the_plain_cached_tokens_in_float32(sampling, variant, monkeypatch):
    monkeypatch.setattr(linear, "PRODUCT_KINDS", ((64, "onednn"),))  # exercise float32 packing whatever its default
    model = opinionated_dalle()
    reference, ref_lp = decode(model, TEXT, sampling=sampling, prepack=False)
    tokens, lp = decode(model, TEXT, sampling=sampling, **variant)
    assert torch.equal(tokens, reference)
    torch.testing.assert_close(lp, ref_lp, atol=1e-4, rtol=1e-4)


def test_static_step_over_the_whole_cache_equals_the_prefix_step():
    """Graph capture attends to every cache slot (kv_len = max_len); the position mask must make that equal to
    attending to the written prefix only."""
    model = opinionated_dalle()
    ids = model._text_ids(TEXT)
    full, prefix = Decoder(model, ids, Sampling(), static=True), Decoder(model, ids, Sampling(), static=True)
    with torch.no_grad():
        torch.testing.assert_close(full.prefill(torch.zeros(3, 0, dtype=torch.long)),
                                   prefix.prefill(torch.zeros(3, 0, dtype=torch.long)))
        for i in range(6):
            tok, index = torch.full((3, 1), i + 1), torch.full((3, 1), i)
            a = full.step(tok, index, kv_len=full.max_len)
            b = prefix.step(tok, index)
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@needs_packing
def test_packed_bfloat16_linear_is_bit_identical_to_f_linear():
    torch.manual_seed(0)
    layer = Linear(64, 96)
    x = torch.randn(2, 3, 64)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = layer(x)
        with packed_linears(layer, rows=6):
            assert layer.packed is not None
            got = layer(x)
    assert layer.packed is None  # dropped on exit: later weight updates are never multiplied stale
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected)


@needs_packing
@pytest.mark.parametrize("kind", ["onednn", "wt"])
def test_packed_float32_linear_matches_f_linear_and_falls_back_for_other_row_counts(kind, monkeypatch):
    monkeypatch.setattr(linear, "PRODUCT_KINDS", ((8, kind),))
    torch.manual_seed(0)
    layer = Linear(64, 96, bias=False)
    with torch.no_grad(), packed_linears(layer, rows=4):
        x = torch.randn(4, 64)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight), atol=1e-5, rtol=1e-5)
        assert layer.packed.fp32.kind == kind  # the packed kernel ran
        x3 = torch.randn(2, 2, 64)  # the module path's (batch, tokens, dim) inputs
        torch.testing.assert_close(layer(x3), F.linear(x3, layer.weight), atol=1e-5, rtol=1e-5)
        x7 = torch.randn(7, 64)
        assert torch.equal(layer(x7), F.linear(x7, layer.weight))


def test_graph_step_arithmetic_gives_the_plain_cached_tokens():
    """The CUDA-graph path (fixed shapes, all cache slots, warm-up writes into slack slots) on the CPU, uncaptured:
    same tokens as the plain cached path, plain and speculative."""
    model = opinionated_dalle()
    reference, _ = decode(model, TEXT, prepack=False)
    graphed, _ = decode(model, TEXT, prepack=False, graphs=True)
    assert torch.equal(graphed, reference)
    g = dict(return_tokens=True, speculative=True, speculative_window=3, cond_scale=2.0, top_k=6)
    a = model.generate_images(TEXT, generator=torch.Generator().manual_seed(0), **g)
    b = model.generate_images(TEXT, generator=torch.Generator().manual_seed(0), cuda_graph=True, **g)
    assert torch.equal(a, b)


def test_graphed_step_refuses_a_growing_cache():
    from dalle_lab.model.graphs import GraphedStep

    model = opinionated_dalle()
    with pytest.raises(ValueError, match="needs Decoder\\(static=True\\)"):
        GraphedStep(Decoder(model, model._text_ids(TEXT), Sampling()), 1)
