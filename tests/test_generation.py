"""DALLE.generate_images over dalle_lab.generate: cache equivalence, guidance, filtering, recorded log-probs, priming,
decoding, bad settings."""
import pytest
import torch

from dalle_lab.model import DALLE
from dalle_lab.generate.sampling import sampling_distribution

from tiny_models import TINY, opinionated_dalle


def prompts(b=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(1, TINY["num_text_tokens"], (b, TINY["text_seq_len"]), generator=g)
    text[0, 3:] = 0
    return text


def generate(model, text, seed=0, **kw):
    return model.generate_images(text, return_tokens=True, generator=torch.Generator().manual_seed(seed), **kw)


@pytest.mark.parametrize("settings", [
    dict(top_k=1),  # greedy
    dict(),  # plain sampling
    dict(temperature=0.7, top_p=0.9, cond_scale=3.0),
    dict(top_k=5, img=torch.randint(0, 24, (3, 16)), num_init_img_tokens=6),
])
def test_cached_and_uncached_generation_give_the_same_tokens(settings):
    model, text = opinionated_dalle(), prompts()
    cached = generate(model, text, use_cache=True, **settings)
    uncached = generate(model, text, use_cache=False, **settings)
    assert cached.shape == (3, 16)
    assert torch.equal(cached, uncached)


def test_sampling_is_reproducible_with_a_generator_and_varies_with_the_seed():
    model, text = opinionated_dalle(), prompts()
    assert torch.equal(generate(model, text, seed=3), generate(model, text, seed=3))
    assert not torch.equal(generate(model, text, seed=3), generate(model, text, seed=4))


def test_guidance_uses_separate_conditional_and_unconditional_passes():
    model, text = opinionated_dalle(), prompts()
    original = text.clone()
    seen = []
    generate(model, text, cond_scale=3.0, logits_callback=lambda i, cond, uncond: seen.append((i, cond, uncond)))
    assert [i for i, _, _ in seen] == list(range(16))
    for _, cond, uncond in seen:
        assert cond.shape == uncond.shape == (3, 24)
        assert (cond - uncond).abs().amax(-1).min() > 1e-3  # differ at every step, for every prompt
    assert torch.equal(text, original)  # the prompt was not zeroed in place
    # the unconditional pass is the all-pad prompt: compare with the model's own logits
    tokens = generate(model, text, cond_scale=3.0)
    torch.testing.assert_close(model.logits(model.null_text(text), tokens)[:, -1], _last_uncond(model, text),
                               atol=1e-4, rtol=1e-4)
    no_guidance = []
    generate(model, text, logits_callback=lambda i, cond, uncond: no_guidance.append(uncond))
    assert all(u is None for u in no_guidance)


def _last_uncond(model, text):
    seen = []
    generate(model, text, cond_scale=3.0, logits_callback=lambda i, cond, uncond: seen.append(uncond))
    return seen[-1]


def test_guidance_changes_the_samples():
    model, text = opinionated_dalle(), prompts()
    assert not torch.equal(generate(model, text, top_k=1), generate(model, text, top_k=1, cond_scale=4.0))


def test_filtering_keeps_exactly_k_image_tokens():
    model, text = opinionated_dalle(), prompts()
    counts = []

    def count(i, cond, uncond):
        counts.append(torch.isfinite(sampling_distribution(cond, top_k=3)).sum(-1))

    tokens = generate(model, text, top_k=3, logits_callback=count)
    assert all((c == 3).all() for c in counts)
    # every sampled token is among that step's top 3
    logits = model.logits(text, tokens)
    rank = (logits > logits.gather(-1, tokens[..., None])).sum(-1)
    assert (rank < 3).all()
    tokens = generate(model, text, filter_thres=0.9)  # keeps int(0.1 * 24) = 2
    logits = model.logits(text, tokens)
    assert ((logits > logits.gather(-1, tokens[..., None])).sum(-1) < 2).all()


@pytest.mark.parametrize("use_cache", [True, False])
def test_recorded_logprobs_equal_recomputed_ones(use_cache):
    model, text = opinionated_dalle(), prompts()
    settings = dict(cond_scale=2.5, temperature=0.8, top_k=8, top_p=0.95)
    prime = torch.randint(0, 24, (3, 16))
    tokens, logprobs = model.generate_images(text, return_tokens=True, return_logprobs=True, use_cache=use_cache,
                                             img=prime, num_init_img_tokens=4,
                                             generator=torch.Generator().manual_seed(0), **settings)
    assert logprobs.shape == (3, 16) and logprobs.dtype == torch.float32
    assert (logprobs[:, :4] == 0).all() and (logprobs[:, 4:] <= 0).all()  # 0 where top_p left one token
    log_probs = sampling_distribution(model.logits(text, tokens), model.logits(model.null_text(text), tokens),
                                      **settings)
    recomputed = log_probs.gather(-1, tokens[..., None]).squeeze(-1)
    torch.testing.assert_close(logprobs[:, 4:], recomputed[:, 4:], atol=1e-4, rtol=1e-4)


def test_priming_keeps_the_given_top_rows():
    model, text = opinionated_dalle(), prompts()
    prime = torch.randint(0, 24, (3, 16))
    tokens = generate(model, text, img=prime, num_init_img_tokens=8)  # the top two rows of the 4x4 grid
    assert torch.equal(tokens[:, :8], prime[:, :8])
    assert not torch.equal(tokens[:, 8:], prime[:, 8:])
    default = generate(model, text, img=prime)
    assert torch.equal(default[:, :7], prime[:, :7])  # default: 14/32 of 16 tokens = 7
    with pytest.raises(ValueError, match="num_init_img_tokens"):
        generate(model, text, img=prime, num_init_img_tokens=16)
    with pytest.raises(ValueError, match="needs img"):
        generate(model, text, num_init_img_tokens=4)


def test_generation_restores_mode_and_rejects_bad_settings():
    model, text = opinionated_dalle(), prompts()
    model.train()
    generate(model, text)
    assert model.training
    with pytest.raises(ValueError, match="return_tokens=True"):
        model.generate_images(text)
    with pytest.raises(ValueError, match="temperature"):
        generate(model, text, temperature=0.0)
    with pytest.raises(ValueError, match="not both"):
        generate(model, text, top_k=3, filter_thres=0.9)


def test_bfloat16_autocast_generation_runs_cached():
    model, text = opinionated_dalle(), prompts()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        tokens, logprobs = model.generate_images(text, return_tokens=True, return_logprobs=True, cond_scale=2.0)
    assert tokens.shape == (3, 16) and torch.isfinite(logprobs).all()


@pytest.fixture(scope="module")
def tiny_vae(tmp_path_factory):
    pytest.importorskip("taming")
    from dalle_lab.vae import VQGanVAE, make_tiny_vqgan

    ckpt, yaml = make_tiny_vqgan(tmp_path_factory.mktemp("vqgan"))
    return VQGanVAE(ckpt, yaml)


def test_pixels_in_and_images_out_with_a_tiny_vqgan(tiny_vae):
    torch.manual_seed(0)
    fields = {k: v for k, v in TINY.items() if k not in ("num_image_tokens", "image_fmap_size")}
    model = DALLE(vae=tiny_vae, **fields).eval()
    assert model.config.image_seq_len == tiny_vae.image_seq_len
    assert not any(key.startswith("vae") for key in model.state_dict())
    text = prompts(b=2)
    pixels = torch.rand(2, 3, tiny_vae.image_size, tiny_vae.image_size)
    out = model(text, pixels, return_loss=True)
    assert torch.isfinite(out)
    images = model.generate_images(text, img=pixels, num_init_img_tokens=tiny_vae.fmap_size, top_k=4)
    assert images.shape == (2, 3, tiny_vae.image_size, tiny_vae.image_size)
    assert images.min() >= 0 and images.max() <= 1


def test_int32_token_ids_are_accepted():
    model, text = opinionated_dalle(), prompts()
    tokens = generate(model, text, top_k=1)
    torch.testing.assert_close(model.logits(text.int(), tokens.int()), model.logits(text, tokens))
    assert torch.isfinite(model(text.int(), tokens.int(), return_loss=True))
