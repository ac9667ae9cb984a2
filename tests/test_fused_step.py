"""The fused one-token decode step (model/fused_step.py) computes the module path's step: logits to float rounding
for every option it supports (rotary embeddings and token shift included), with every product layout; the options
it does not support say why, and `auto` keeps the module path for them. Whole generations: test_generate_strategies.
"""
import pytest
import torch

from dalle_lab.generate import GenerationConfig
from dalle_lab.generate.decoder import Decoder
from dalle_lab.model import fused_step, linear

from tiny_models import opinionated_dalle

TEXT = torch.tensor([[3, 9, 4, 0, 0], [7, 1, 0, 0, 0], [2, 2, 2, 2, 2]])
SUPPORTED = [dict(), dict(stable=True), dict(sandwich_norm=True), dict(depth=3, shared_attn_ids=(0, 0, 1),
             shared_ff_ids=(0, 1, 1)), dict(share_input_output_emb=True), dict(layer_scale=True, sandwich_norm=True),
             dict(layer_scale=True, stable=True, stable_style="dallepytorch", depth=3, shared_attn_ids=(0, 0, 1)),
             dict(rotary_emb=True), dict(shift_tokens=True),
             dict(rotary_emb=True, shift_tokens=True, stable=True, sandwich_norm=True),
             dict(rotary_emb=True, shift_tokens=True, layer_scale=True, rotary_style="dallepytorch", dim=30),
             dict(rotary_emb=True, shift_tokens=True, layer_scale=True, rotary_style="dallepytorch",
                  attention_math="dallepytorch", stable=True, stable_style="dallepytorch")]
KINDS = ["linear", "wt"] + (["onednn"] if torch.backends.mkldnn.is_available() else [])


def _decoders(model, guided=True):
    """A decoder stepping through the modules and one stepping through the fused step, over their own caches."""
    config = GenerationConfig(cond_scale=2.0 if guided else 1.0)
    return Decoder(model, model.text_ids(TEXT), config), Decoder(model, model.text_ids(TEXT), config)


def _fused_logits(dec, fused, token, i):
    x = dec.embed(token, torch.full((3, 1), i)).view(dec.rows, -1)
    return fused(x, dec.T + 1 + i)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("options", SUPPORTED)
def test_fused_step_logits_equal_the_module_step(options, kind, monkeypatch):
    monkeypatch.setattr(linear, "PRODUCT_KINDS", ((6, kind),))
    model = opinionated_dalle(**options)
    assert model.why_not_fused() is None
    plain, fused_dec = _decoders(model)
    with torch.no_grad(), model.packed_weights(rows=6):
        prime = torch.zeros(3, 0, dtype=torch.long)
        torch.testing.assert_close(fused_dec.prefill(prime), plain.prefill(prime))
        fused = model.fused_step(fused_dec.caches, fused_dec.rows)
        for i in range(model.config.image_seq_len - 1):
            token = torch.full((3, 1), (5 * i) % 24)
            a, b = _fused_logits(fused_dec, fused, token, i), plain.step_at(token, i)
            assert a.shape == b.shape == (6, 24)
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert fused.plan.layers[0].qkv.kind == fused.plan.head.kind == kind  # the layout asked for really ran


def test_rotary_tables_rotate_exactly_as_the_module_path():
    """x * cos + swap(x) * sin is apply_rotary term for term: the same bits, not only the same values."""
    from dalle_lab.model.positional import apply_rotary, rotary_angles

    model = opinionated_dalle(rotary_emb=True)
    t = model.transformer
    cos, sin = fused_step.rotary_tables(model, 30, "cpu")
    x = torch.randn(4, 2, t.heads, t.dim_head)
    for pos in (0, 3, t.text_len, t.text_len + 7, 29):
        expected = apply_rotary(x, *rotary_angles(torch.tensor([pos]), t.text_len, t.fmap, t.dim_head))
        assert torch.equal(fused_step._rotate(x, cos[pos], sin[pos]), expected)


def test_product_kinds_are_chosen_by_row_count(monkeypatch):
    monkeypatch.setattr(linear, "PRODUCT_KINDS", ((4, "wt"), (16, "linear"), (32, "wt")))
    assert [linear.product_kind(r) for r in (1, 4, 5, 16, 17, 32, 33)] == ["wt", "wt", "linear", "linear", "wt",
                                                                                "wt", "linear"]


def test_without_packing_the_fused_step_multiplies_as_f_linear(monkeypatch):
    monkeypatch.setattr(linear, "PRODUCT_KINDS", ((64, "wt"),))
    model = opinionated_dalle()
    _, dec = _decoders(model, guided=False)
    with torch.no_grad():
        dec.prefill(torch.zeros(3, 0, dtype=torch.long))
        fused = model.fused_step(dec.caches, dec.rows)
    assert fused.plan.head.kind == fused.plan.layers[0].ff_in.kind == "linear"


@pytest.mark.parametrize("options, reason", [(dict(attn_types=("full", "axial_row")), "sparse attention"),
                                             (dict(attn_types=("conv_like",)), "sparse attention")])
def test_sparse_attention_keeps_the_module_path_and_says_why(options, reason):
    model = opinionated_dalle(**options)
    assert reason in model.why_not_fused()
    with pytest.raises(ValueError, match=f"strategy 'fused' cannot run this model: {reason}"):
        model.generate_images(TEXT, return_tokens=True, strategy="fused")


def test_training_mode_bf16_and_autocast_keep_the_module_path():
    model = opinionated_dalle()
    assert model.why_not_fused() is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert "autocast" in model.why_not_fused()
    assert "training" in model.train().why_not_fused()
    assert "float32" in model.eval().to(torch.bfloat16).why_not_fused()


def test_a_step_past_the_cache_raises_like_the_module_path():
    model = opinionated_dalle()
    plain, dec = _decoders(model)
    n = model.config.image_seq_len
    with torch.no_grad():
        for d in (plain, dec):
            d.prefill(torch.zeros(3, 0, dtype=torch.long))
        fused = model.fused_step(dec.caches, dec.rows)
        with pytest.raises(ValueError, match="KV cache overflow"):
            plain.step_at(torch.ones(3, 1, dtype=torch.long), n)
        with pytest.raises(ValueError, match="KV cache overflow"):
            _fused_logits(dec, fused, torch.ones(3, 1, dtype=torch.long), n)


def test_generate_images_runs_the_fused_step_with_the_packed_product_kinds(monkeypatch):
    built, init = [], fused_step.FusedStep.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        built.append({p.kind for layer in self.plan.layers for p in (layer.qkv, layer.attn_out, layer.ff_in,
                                                                      layer.ff_out)} | {self.plan.head.kind})

    monkeypatch.setattr(fused_step.FusedStep, "__init__", spy)
    model = opinionated_dalle()
    model.generate_images(TEXT, return_tokens=True)  # the default strategy
    assert built == [{linear.product_kind(3)}]
