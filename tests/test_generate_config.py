"""GenerationConfig and generate(): settings are checked where they are given, in one line each, and generate() is
the call every caller passes a config to (generate.py, the training grids, the alignment sampler)."""
import dataclasses

import pytest
import torch

from dalle_lab.generate import STRATEGIES, GenerationConfig, generate

from tiny_models import TINY, opinionated_dalle

TEXT = torch.tensor([[3, 9, 4, 0, 0], [7, 1, 0, 0, 0]])


@pytest.mark.parametrize("fields, message", [
    (dict(strategy="fast"), "unknown generation strategy 'fast'; choose from auto, plain, fused, compiled"),
    (dict(filter_thres=0.9), r"give top_k \(10\) or filter_thres \(0.9\), not both .*pass top_k=None"),
    (dict(top_k=0), "top_k must be >= 1"),
    (dict(top_k=None, filter_thres=1.0), r"filter_thres must be in \[0, 1\)"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(temperature=0.0), "temperature must be > 0"),
    (dict(speculative_window=0), "speculative_window must be >= 1"),
])
def test_bad_settings_are_refused_in_one_line(fields, message):
    with pytest.raises(ValueError, match=message) as info:
        GenerationConfig(**fields)
    assert "\n" not in str(info.value)


def test_defaults_are_generate_pys_and_top_k_resolves_over_the_image_vocabulary():
    config = GenerationConfig()
    assert (config.top_k, config.temperature, config.cond_scale, config.strategy) == (10, 0.7, 2.0, "auto")
    assert config.guided and not GenerationConfig(cond_scale=1.0).guided
    assert GenerationConfig(top_k=None, filter_thres=0.9).top_k_of(512) == 51
    assert GenerationConfig(top_k=100).top_k_of(24) == 24 and GenerationConfig(top_k=None).top_k_of(24) is None
    assert set(STRATEGIES) == {"auto", "plain", "fused", "compiled", "speculative", "graph", "uncached"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.strategy = "plain"  # a config is a value: nothing changes it behind a caller's back


def test_generate_equals_generate_images_with_the_same_settings_and_restores_the_mode():
    model = opinionated_dalle().train()
    config = GenerationConfig(top_k=5, temperature=0.9, cond_scale=2.5)
    tokens, logprobs = generate(model, TEXT, config, generator=torch.Generator().manual_seed(3))
    assert model.training  # put back in the mode it was in
    wrapped, wrapped_lp = model.generate_images(TEXT, top_k=5, temperature=0.9, cond_scale=2.5, return_tokens=True,
                                                return_logprobs=True, generator=torch.Generator().manual_seed(3))
    assert torch.equal(tokens, wrapped) and torch.equal(logprobs, wrapped_lp)
    assert tokens.shape == logprobs.shape == (2, TINY["image_fmap_size"] ** 2)


def test_a_prime_is_kept_and_its_positions_have_log_prob_zero():
    model = opinionated_dalle()
    prime = torch.tensor([[1, 2, 3], [4, 5, 6]])
    tokens, logprobs = generate(model, TEXT, GenerationConfig(), prime=prime, generator=torch.Generator())
    assert torch.equal(tokens[:, :3], prime) and logprobs[:, :3].eq(0).all() and logprobs[:, 3:].lt(0).any()


def test_strategies_that_cannot_apply_say_why():
    model = opinionated_dalle()
    with pytest.raises(ValueError, match="takes no logits_callback"):
        generate(model, TEXT, GenerationConfig(strategy="speculative"), logits_callback=lambda *a: None)
    with pytest.raises(ValueError, match="cannot run this model: sparse attention types"):
        generate(opinionated_dalle(attn_types=("axial_row",)), TEXT, GenerationConfig(strategy="fused"))
    with pytest.raises(ValueError, match="cannot run this model: autocast is on"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            generate(model, TEXT, GenerationConfig(strategy="compiled"))
    model.train()
    assert generate(model, TEXT, GenerationConfig(strategy="fused"))[0].shape == (2, 16)  # generation runs in eval
