"""The fused one-token decode step (fused_step.py) computes the module path's step: logits to float rounding and
the same sampled tokens, for every option it supports; the options it does not support fall back."""
import pytest
import torch

from dalle_lab.model import fused_step, linear
from dalle_lab.model.decoding import Decoder, Sampling, plain_decode
from dalle_lab.model.linear import packed_linears

from tiny_models import opinionated_dalle

TEXT = torch.tensor([[3, 9, 4, 0, 0], [7, 1, 0, 0, 0], [2, 2, 2, 2, 2]])
SUPPORTED = [dict(), dict(stable=True), dict(sandwich_norm=True), dict(depth=3, shared_attn_ids=(0, 0, 1),
             shared_ff_ids=(0, 1, 1)), dict(share_input_output_emb=True), dict(layer_scale=True, sandwich_norm=True),
             dict(layer_scale=True, stable=True, stable_style="dallepytorch", depth=3, shared_attn_ids=(0, 0, 1))]
KINDS = ["linear", "wt"] + (["onednn"] if torch.backends.mkldnn.is_available() else [])
UNSUPPORTED = [dict(attn_types=("full", "axial_row")), dict(attn_types=("conv_like",)), dict(rotary_emb=True),
               dict(shift_tokens=True)]


def decode(model, sampling, fused, prepack=True):
    tokens = torch.zeros(TEXT.shape[0], model.config.image_seq_len, dtype=torch.long)
    logprobs = torch.zeros(tokens.shape)
    with torch.no_grad():
        plain_decode(model, model._text_ids(TEXT), tokens, logprobs, 0, sampling, torch.Generator().manual_seed(0),
                     fused=fused, prepack=prepack)
    return tokens, logprobs


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("options", SUPPORTED)
def test_fused_step_logits_equal_the_module_step(options, kind, monkeypatch):
    monkeypatch.setattr(linear, "PRODUCT_KINDS", ((6, kind),))
    model = opinionated_dalle(**options)
    ids = model._text_ids(TEXT)
    fused, plain = (Decoder(model, ids, Sampling(cond_scale=2.0), fused=f) for f in (True, False))
    with torch.no_grad(), packed_linears(model, rows=6):
        prime = torch.zeros(3, 0, dtype=torch.long)
        torch.testing.assert_close(fused.prefill(prime), plain.prefill(prime))
        for i in range(model.config.image_seq_len - 1):
            tok = torch.full((3, 1), (5 * i) % 24)
            a = fused.step(tok, torch.full((3, 1), i), at=i)
            b = plain.step(tok, torch.full((3, 1), i), at=i)
            assert a.shape == b.shape == (6, 1, 24)
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert fused._fused_step is not None and plain._fused_step is None  # the fused path really ran
    assert fused._fused_step.layers[0].qkv.kind == fused._fused_step.head.kind == kind


@pytest.mark.parametrize("sampling", [Sampling(temperature=0.9, top_k=8), Sampling(cond_scale=3.0, top_p=0.9)])
@pytest.mark.parametrize("options", SUPPORTED)
def test_fused_generation_gives_the_module_path_tokens(options, sampling):
    model = opinionated_dalle(**options)
    reference, ref_lp = decode(model, sampling, fused=False)
    tokens, lp = decode(model, sampling, fused=True)
    assert torch.equal(tokens, reference)
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)


def test_product_kinds_are_chosen_by_row_count(monkeypatch):
    monkeypatch.setattr(linear, "PRODUCT_KINDS", ((4, "wt"), (16, "linear"), (32, "wt")))
    assert [linear.product_kind(r) for r in (1, 4, 5, 16, 17, 32, 33)] == ["wt", "wt", "linear", "linear", "wt",
                                                                                "wt", "linear"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_product_kind_gives_the_module_path_tokens(kind, monkeypatch):
    monkeypatch.setattr(linear, "PRODUCT_KINDS", ((64, kind),))
    model = opinionated_dalle()
    sampling = Sampling(cond_scale=3.0, top_k=8)
    assert torch.equal(decode(model, sampling, fused=True)[0], decode(model, sampling, fused=False)[0])


def test_without_packing_the_fused_step_multiplies_as_f_linear(monkeypatch):
    monkeypatch.setattr(linear, "PRODUCT_KINDS", ((64, "wt"),))
    model = opinionated_dalle()
    with torch.no_grad():
        dec = Decoder(model, model._text_ids(TEXT), Sampling(), fused=True)
        dec.prefill(torch.zeros(3, 0, dtype=torch.long))
        dec.step(torch.ones(3, 1, dtype=torch.long), torch.zeros(3, 1, dtype=torch.long), at=0)
    assert dec._fused_step.head.kind == dec._fused_step.layers[0].ff_in.kind == "linear"
    unpacked, _ = decode(model, Sampling(top_k=8), fused=True, prepack=False)
    assert torch.equal(unpacked, decode(model, Sampling(top_k=8), fused=False, prepack=False)[0])


@pytest.mark.parametrize("options", UNSUPPORTED)
def test_unsupported_options_keep_the_module_path(options):
    model = opinionated_dalle(**options)
    assert not fused_step.fused_supported(model)
    assert not Decoder(model, model._text_ids(TEXT), Sampling(), fused=True).fused


def test_training_mode_bf16_autocast_and_static_caches_keep_the_module_path():
    model = opinionated_dalle()
    ids = model._text_ids(TEXT)
    assert fused_step.fused_supported(model)
    assert not Decoder(model, ids, Sampling(), static=True, fused=True).fused
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fused_step.fused_supported(model)
    assert not fused_step.fused_supported(model.train())
    assert not fused_step.fused_supported(model.eval().to(torch.bfloat16))


def test_a_step_past_the_cache_raises_like_the_module_path():
    model = opinionated_dalle()
    for fused in (True, False):
        dec = Decoder(model, model._text_ids(TEXT), Sampling(), fused=fused)
        with torch.no_grad():
            dec.prefill(torch.zeros(3, 0, dtype=torch.long))
            n = model.config.image_seq_len
            with pytest.raises(ValueError, match="KV cache overflow"):
                dec.step(torch.ones(3, 1, dtype=torch.long), torch.full((3, 1), n), at=n)


def test_generate_images_runs_the_fused_step_with_the_packed_product_kinds(monkeypatch):
    built, init = [], fused_step.FusedStep.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        built.append({p.kind for layer in self.layers for p in (layer.qkv, layer.attn_out, layer.ff_in, layer.ff_out)}
                     | {self.head.kind})

    monkeypatch.setattr(fused_step.FusedStep, "__init__", spy)
    model = opinionated_dalle()
    model.generate_images(TEXT, return_tokens=True, speculative=False)
    assert built == [{linear.product_kind(3)}]
