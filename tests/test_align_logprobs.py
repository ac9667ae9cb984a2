"""The policy's log-probs are the sampler's (issue 14 section 3): recorded == recomputed in float32 and bfloat16,
cached == uncached generation in bfloat16, the sampler's top-k / top-p support reused by the update, the KL of what
is sampled."""
import contextlib

import pytest
import torch

from dalle_lab.generate import sampling
from dalle_lab.align.config import AlignConfig
from dalle_lab.align.logprobs import pack_mask, policy_logprobs, sample_with_support, unpack_mask
from dalle_lab.align.policy_gradient import PolicyGradientTrainer, token_kl
from dalle_lab.rewards import brightness

from test_align_finetune import PROMPTS, tiny_dalle  # noqa: E402  (the tiny DALLE and its stand-in VAE)

# plain sampling unless a setting says otherwise (AlignConfig's own defaults are generate.py's sampling)
PLAIN = dict(temperature=1.0, top_k=None, top_p=None, cond_scale=1.0)
SETTINGS = [dict(), dict(temperature=0.7, top_k=6, cond_scale=2.0), dict(top_p=0.8, temperature=1.3),
            dict(cond_scale=3.0, top_p=0.9), dict(top_k=4, top_p=0.7, cond_scale=1.5, temperature=0.8)]


def autocast(precision):
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@pytest.fixture(scope="module")
def tokenizer():
    from dalle_lab.tokenizers import get_tokenizer

    return get_tokenizer()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("settings", SETTINGS)
def test_recomputed_logprobs_equal_the_samplers(tokenizer, settings, precision):
    dalle = tiny_dalle(tokenizer).eval()
    config = AlignConfig(**{**PLAIN, **settings})
    text = tokenizer.tokenize(PROMPTS * 2, 16)
    with autocast(precision), torch.no_grad():
        tokens, recorded, support = sample_with_support(dalle, text, config, torch.Generator().manual_seed(0))
        with_support, full, _ = policy_logprobs(dalle, text, tokens, config, support)
        refiltered, _, _ = policy_logprobs(dalle, text, tokens, config)
    assert (support is None) == ("top_k" not in settings and "top_p" not in settings)
    # the bound is 1e-4 nats; float32 rounding gives ~2e-7 here and bf16 autocast on the CPU is bit-exact
    torch.testing.assert_close(with_support, recorded, atol=1e-5, rtol=0)
    torch.testing.assert_close(refiltered, recorded, atol=1e-5, rtol=0)
    if support is not None:  # the update's distribution lives on exactly the sampler's support
        assert torch.equal(torch.isfinite(full), unpack_mask(support, full.shape[-1]))


def test_bf16_cached_and_uncached_generation_give_the_same_tokens(tokenizer):
    dalle = tiny_dalle(tokenizer).eval()
    text = tokenizer.tokenize(PROMPTS * 3, 16)
    outs = []
    for use_cache in (True, False):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs.append(dalle.generate_images(text, cond_scale=3.0, top_p=0.9, use_cache=use_cache,
                                              return_tokens=True, return_logprobs=True,
                                              generator=torch.Generator().manual_seed(1)))
    assert torch.equal(outs[0][0], outs[1][0])
    assert torch.equal(outs[0][1], outs[1][1])


def test_pack_mask_round_trips():
    mask = torch.rand(3, 5, 21) > 0.5
    packed = pack_mask(mask)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 5, 3)
    assert torch.equal(unpack_mask(packed, 21), mask)


def test_a_moved_topk_boundary_keeps_the_sampled_token_and_is_counted(tokenizer):
    """After the model moves, its own top-k keeps other tokens at some positions: refiltering would give sampled
    tokens log-prob -inf (ratio 0, no gradient); the recorded support keeps them finite, and the flips are counted."""
    dalle = tiny_dalle(tokenizer).eval()
    config = AlignConfig(**{**PLAIN, "top_k": 3})
    text = tokenizer.tokenize(PROMPTS * 2, 16)
    tokens, recorded, support = sample_with_support(dalle, text, config, torch.Generator().manual_seed(0))
    with torch.no_grad():
        dalle.to_image_logits.weight.add_(0.5 * torch.randn_like(dalle.to_image_logits.weight))
        refiltered, _, _ = policy_logprobs(dalle, text, tokens, config)
        kept, _, _, flips = policy_logprobs(dalle, text, tokens, config, support, return_flips=True)
    assert torch.isinf(refiltered).any()  # the failure the recorded support prevents
    assert torch.isfinite(kept).all()
    own = torch.isfinite(policy_logprobs(dalle, text, tokens, config)[1])
    assert flips == int((own != unpack_mask(support, own.shape[-1])).any(-1).sum()) > 0


def test_sampling_kl_compares_the_guided_distributions_on_the_samplers_support(tokenizer, tmp_path):
    config = AlignConfig(epochs=1, prompts_per_epoch=2, group_size=2, sample_batch_size=4, train_batch_size=4,
                         cond_scale=2.0, temperature=0.9, top_k=5)
    trainer = PolicyGradientTrainer(tiny_dalle(tokenizer), tokenizer, config, PROMPTS, tmp_path, reward=brightness,
                                    log_fn=lambda _: None)
    text = trainer.tokenize(PROMPTS[:2])
    tokens, _, support = trainer.sample_tokens(text, torch.Generator().manual_seed(0))
    with torch.no_grad():
        trainer.dalle.to_image_logits.bias.add_(0.3 * torch.randn_like(trainer.dalle.to_image_logits.bias))
        _, processed, model_full = policy_logprobs(trainer.dalle, text, tokens, config, support)
        reference = trainer.kl_reference_logprobs(text, tokens, support)
        kl = token_kl(trainer.kl_policy_logprobs(processed, model_full), reference)
        # by hand: both models' guided, tempered distributions renormalised over the sampler's kept tokens
        kept = unpack_mask(support, processed.shape[-1])

        def by_hand(model):
            cond, null = model.logits(text, tokens), model.logits(model.null_text(text), tokens)
            logits = sampling.apply_guidance(cond, null, 2.0) / 0.9
            return logits.masked_fill(~kept, float("-inf")).log_softmax(-1)

        p, q = by_hand(trainer.dalle), by_hand(trainer.reference)
        expected = (p.exp() * (p - q)).nan_to_num(0.0).sum(-1)
    assert torch.isfinite(kl).all() and kl.min() >= -1e-6 and kl.max() > 1e-4
    torch.testing.assert_close(kl, expected, atol=1e-5, rtol=1e-4)
    trainer.config.kl_distribution = "conditional"  # the other choice: the plain conditional distributions
    torch.testing.assert_close(trainer.kl_reference_logprobs(text, tokens, support),
                               trainer.reference_logprobs(text, tokens))


def test_conditional_guidance_grad_moves_the_model_through_the_captioned_branch_only(tokenizer):
    """guidance_grad="conditional": the same log-probs, and the gradient of the guided log-probs with the
    caption-free logits held constant (written out here by hand)."""
    dalle = tiny_dalle(tokenizer).eval()
    config = AlignConfig(**{**PLAIN, "cond_scale": 2.0, "temperature": 0.7, "guidance_grad": "conditional"})
    text = tokenizer.tokenize(PROMPTS[:2], dalle.config.text_seq_len)
    tokens, _, _ = sample_with_support(dalle, text, config, torch.Generator().manual_seed(0))
    params = [p for p in dalle.parameters() if p.requires_grad]

    def gradient(logprobs):
        return torch.autograd.grad(logprobs.sum(), params, allow_unused=True)

    cond = dalle.logits(text, tokens).float()
    null = dalle.logits(dalle.null_text(text), tokens).float().detach()
    by_hand = torch.log_softmax((null + 2.0 * (cond - null)) / 0.7, -1).gather(-1, tokens[..., None])[..., 0]
    conditional = policy_logprobs(dalle, text, tokens, config)[0]
    both = policy_logprobs(dalle, text, tokens, AlignConfig(**{**PLAIN, "cond_scale": 2.0, "temperature": 0.7,
                                                               "guidance_grad": "both"}))[0]
    torch.testing.assert_close(conditional, both)  # the values do not depend on where the gradient goes
    expected, got, other = gradient(by_hand), gradient(conditional), gradient(both)
    for e, g in zip(expected, got):
        if e is not None:
            torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-4)
    assert max((o - e).abs().max() for o, e in zip(other, expected) if e is not None) > 1e-3
