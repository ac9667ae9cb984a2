"""The KV cache and packed weights: writing the cache in place, every row at one position or each at its own
(attending to the whole buffer under the position mask equals attending to the written prefix), packed products
equal to F.linear (bf16 bit for bit), and generation with packing against generation without."""
import pytest
import torch
import torch.nn.functional as F

from dalle_lab.generate import GenerationConfig
from dalle_lab.generate.cache import KVCache
from dalle_lab.generate.decoder import Decoder
from dalle_lab.model import linear
from dalle_lab.model.linear import Linear, packed_linears, packing_available

from tiny_models import opinionated_dalle

needs_packing = pytest.mark.skipif(not packing_available(), reason="this torch build has no MKL / oneDNN")

TEXT = torch.tensor([[3, 9, 4, 0, 0], [7, 1, 0, 0, 0], [2, 2, 2, 2, 2]])


def test_kv_cache_is_preallocated_and_written_in_place():
    cache = KVCache(max_len=6)
    first = torch.randn(2, 1, 2, 3, 4)  # (keys/values, rows, heads, positions, dim_head)
    keys, values = cache.write(0, first)
    storage = cache.buffer.data_ptr()
    step = torch.randn(2, 1, 2, 1, 4)
    keys, values = cache.write(3, step)
    assert cache.buffer.data_ptr() == storage  # no reallocation, no concatenation
    assert keys.shape == (1, 2, 4, 4) and keys.data_ptr() == storage
    torch.testing.assert_close(keys[:, :, :3], first[0])
    torch.testing.assert_close(values[:, :, 3:], step[1])
    assert cache.buffer[:, :, :, 4:].eq(0).all()  # never-written slots are zeros (masked, never garbage)
    with pytest.raises(ValueError, match="overflow"):
        cache.write(6, step)


def test_kv_cache_scatter_writes_each_row_at_its_own_positions():
    cache = KVCache(max_len=5)
    kv = torch.randn(2, 2, 1, 2, 3)
    keys, _ = cache.scatter(torch.tensor([[0, 1], [3, 4]]), kv)
    assert keys.shape == (2, 1, 5, 3)
    torch.testing.assert_close(keys[0, :, :2], kv[0, 0])
    torch.testing.assert_close(keys[1, :, 3:], kv[0, 1])
    assert keys[0, :, 2:].eq(0).all() and keys[1, :, :3].eq(0).all()


def test_a_step_over_the_whole_cache_equals_the_prefix_step():
    """Graph capture attends to every cache slot (kv_len = max_len); the position mask must make that equal to
    attending to the written prefix only."""
    model = opinionated_dalle()
    ids = model.text_ids(TEXT)
    full, prefix = (Decoder(model, ids, GenerationConfig(cond_scale=1.0)) for _ in range(2))
    with torch.no_grad():
        torch.testing.assert_close(full.prefill(torch.zeros(3, 0, dtype=torch.long)),
                                   prefix.prefill(torch.zeros(3, 0, dtype=torch.long)))
        for i in range(6):
            tok, index = torch.full((3, 1), i + 1), torch.full((3, 1), i)
            a = full.step(tok, index, kv_len=full.max_len)
            b = prefix.step(tok, index)
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("config", [dict(temperature=0.9, top_k=8), dict(cond_scale=3.0, top_p=0.9, top_k=None)])
@pytest.mark.parametrize("strategy", ["plain", "fused"])
def test_packed_float32_products_give_the_unpacked_tokens(config, strategy, monkeypatch):
    model = opinionated_dalle()

    def run():
        return model.generate_images(TEXT, return_tokens=True, return_logprobs=True, strategy=strategy,
                                     generator=torch.Generator().manual_seed(0), **config)

    monkeypatch.setattr(linear, "PRODUCT_KINDS", ())  # F.linear's layout for every row count
    reference, ref_lp = run()
    monkeypatch.setattr(linear, "PRODUCT_KINDS", ((64, "onednn" if packing_available() else "wt"),))
    tokens, lp = run()
    assert torch.equal(tokens, reference)
    torch.testing.assert_close(lp, ref_lp, atol=1e-4, rtol=1e-4)


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
