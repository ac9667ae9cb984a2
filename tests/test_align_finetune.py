"""Both fine-tuning paths on a tiny DALLE with a token-level stand-in VAE (one flat colour patch per token).

Covers: log-prob bookkeeping (recorded == recomputed, ratios 1 at the first inner step, with guidance, temperature
and top-k), the PPO clip, the KL term, per-prompt advantages inside a real epoch, resume, LoRA, and the Gumbel path's
gradient truncation to the last K tokens.
"""
import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dalle_lab.align import reward_backprop as RB
from dalle_lab.align.config import AlignConfig
from dalle_lab.align.policy_gradient import PolicyGradientTrainer, policy_logprobs, ppo_clipped_loss, token_kl
from dalle_lab.rewards import brightness
from dalle_lab.data.shapes import validation_captions
from dalle_lab.model import DALLE
from dalle_lab.tokenizers import get_tokenizer


class PatchVAE(nn.Module):
    """Stand-in image tokenizer: token t decodes to a `patch` x `patch` square of colour codebook[t]."""

    def __init__(self, num_tokens=16, fmap_size=4, patch=4):
        super().__init__()
        self.num_tokens, self.fmap_size, self.patch = num_tokens, fmap_size, patch
        self.image_size, self.image_seq_len = fmap_size * patch, fmap_size ** 2
        self.register_buffer("codebook", torch.rand(num_tokens, 3, generator=torch.Generator().manual_seed(0)))
        self.identity = {"kind": "test_patch_vae", "sha256": "0" * 64}

    def decode_soft(self, probs):
        colours = probs.to(self.codebook.dtype) @ self.codebook  # (B, N, 3)
        grid = colours.view(-1, self.fmap_size, self.fmap_size, 3).permute(0, 3, 1, 2)
        return grid.repeat_interleave(self.patch, dim=2).repeat_interleave(self.patch, dim=3)

    def decode(self, indices):
        return self.decode_soft(F.one_hot(indices, self.num_tokens).float())


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer()


def tiny_dalle(tokenizer, seed=0):
    torch.manual_seed(seed)
    return DALLE(vae=PatchVAE(), dim=32, depth=2, heads=2, dim_head=16, num_text_tokens=tokenizer.vocab_size,
                 text_seq_len=16)


PROMPTS = validation_captions(4)


def make_trainer(tokenizer, tmp_path, cls=PolicyGradientTrainer, reward=brightness, eval_sets=None, **overrides):
    settings = dict(epochs=1, prompts_per_epoch=2, group_size=3, sample_batch_size=4, train_batch_size=3,
                    gradient_accumulation_steps=1,
                    inner_epochs=2, lr=1e-3, stat_min_count=2, seed=0,
                    temperature=1.0, top_k=None, cond_scale=1.0,  # the model's own distribution, whatever the defaults
                    eval_num_prompts=0, eval_num_heldout=0,  # no in-run evaluation (tests/test_align_eval.py has it)
                    diversity_weight=0.0)  # the bonus: test_align_diversity_bonus.py
    settings.update(overrides)
    config = AlignConfig(**settings)
    return cls(tiny_dalle(tokenizer), tokenizer, config, PROMPTS, tmp_path, reward=reward, log_fn=lambda _: None,
               eval_sets=eval_sets)


@pytest.mark.parametrize("sampling", [dict(), dict(temperature=0.7, top_k=6, cond_scale=2.0),
                                      dict(top_p=0.8, temperature=1.3)])
def test_recorded_logprobs_equal_recomputed_and_first_ratios_are_one(tokenizer, tmp_path, sampling):
    trainer = make_trainer(tokenizer, tmp_path, **sampling)
    batch = trainer.collect(trainer.epoch_prompts(0))
    with torch.no_grad():
        recomputed, processed, _ = policy_logprobs(trainer.dalle, batch["text"], batch["tokens"], trainer.config)
    torch.testing.assert_close(recomputed, batch["old_logprobs"], atol=2e-5, rtol=0)
    assert torch.isfinite(recomputed).all()
    if "top_k" in sampling:  # the filtered support is part of the distribution: exactly k tokens remain
        assert (torch.isfinite(processed).sum(-1) == sampling["top_k"]).all()
    log = trainer.train_epoch(trainer.epoch_prompts(0))
    assert log["max_abs_logratio_first_step"] < 2e-5  # ratio == 1 at the first inner step


def test_ppo_clip_stops_the_gradient_outside_the_trust_region():
    old = torch.zeros(2, 3)
    new = torch.tensor([[0.5, 0.05, -0.5], [0.5, 0.05, -0.5]], requires_grad=True)  # ratios e^0.5, e^0.05, e^-0.5
    advantages = torch.tensor([1.0, -1.0])
    loss, stats = ppo_clipped_loss(new, old, advantages, clip_range=0.2)
    loss.backward()
    grad = new.grad
    # positive advantage: a ratio above 1.2 is clipped (no gradient), one below 0.8 still gets pushed up
    assert grad[0, 0] == 0 and grad[0, 1] < 0 and grad[0, 2] < 0
    # negative advantage: a ratio below 0.8 is clipped, one above 1.2 still gets pushed down
    assert grad[1, 2] == 0 and grad[1, 1] > 0 and grad[1, 0] > 0
    assert stats["clipfrac"] == pytest.approx(4 / 6)
    ratio = new.detach().exp()
    expected = torch.maximum(-advantages[:, None] * ratio, -advantages[:, None] * ratio.clamp(0.8, 1.2)).mean()
    assert loss.item() == pytest.approx(expected.item())


def test_kl_is_zero_against_itself_and_positive_otherwise(tokenizer, tmp_path):
    logprobs = torch.log_softmax(torch.randn(2, 5, 7), -1)
    assert token_kl(logprobs, logprobs).abs().max() < 1e-6
    assert (token_kl(logprobs, torch.log_softmax(torch.randn(2, 5, 7), -1)) > 0).all()
    trainer = make_trainer(tokenizer, tmp_path)
    text = trainer.tokenize(PROMPTS[:2])
    tokens, _ = trainer.dalle.generate_images(text, return_tokens=True, return_logprobs=True)
    _, _, model_full = policy_logprobs(trainer.dalle, text, tokens, trainer.config)
    assert token_kl(model_full, trainer.reference_logprobs(text, tokens)).abs().max() < 1e-6


def test_an_update_raises_the_logprob_of_better_than_average_images(tokenizer, tmp_path):
    trainer = make_trainer(tokenizer, tmp_path, inner_epochs=1, train_batch_size=6, kl_coef=0.0, lr=3e-3)
    prompts = trainer.epoch_prompts(0)
    batch = trainer.collect(prompts)
    token_advantages, informative = trainer.advantages(prompts, batch)
    assert token_advantages.shape == batch["tokens"].shape and informative.all()
    advantages = token_advantages[:, 0]  # uniform credit: every token of an image has the image's advantage
    assert torch.equal(token_advantages, advantages[:, None].expand_as(token_advantages))
    # per-prompt normalisation: the groups have 3 samples each and each group's advantages are centred
    for start in (0, 3):
        assert abs(advantages[start:start + 3].sum().item()) < 1e-4
    sampled, _, _ = policy_logprobs(trainer.dalle, batch["text"], batch["tokens"], trainer.config)
    loss, _ = ppo_clipped_loss(sampled, batch["old_logprobs"], advantages, 0.2)
    trainer.step(loss)
    with torch.no_grad():
        after, _, _ = policy_logprobs(trainer.dalle, batch["text"], batch["tokens"], trainer.config)
    change = (after - batch["old_logprobs"]).sum(-1)
    best, worst = advantages.argmax(), advantages.argmin()
    assert change[best] > change[worst]


def test_epochs_log_save_and_resume(tokenizer, tmp_path):
    trainer = make_trainer(tokenizer, tmp_path, epochs=2)
    history = trainer.train()
    assert [row["epoch"] for row in history] == [0, 1]
    for key in ("reward_mean", "reward_std", "kl_ref_image", "approx_kl", "clipfrac", "entropy", "images_sampled"):
        assert key in history[-1]
    assert history[-1]["images_sampled"] == 12
    for name in ("reward_curve.png", "samples_before.png", "samples_after.png", "dalle_aligned.pt", "log.jsonl"):
        assert (tmp_path / name).exists(), name
    exported = torch.load(tmp_path / "dalle_aligned.pt", weights_only=True)
    weights = dict(trainer.dalle.named_parameters())
    torch.testing.assert_close(exported["model"]["to_image_logits.weight"], weights["to_image_logits.weight"])

    resumed = make_trainer(tokenizer, tmp_path, epochs=3)
    assert resumed.epoch == 2 and resumed.images_sampled == 12
    torch.testing.assert_close(dict(resumed.dalle.named_parameters())["to_image_logits.weight"],
                               weights["to_image_logits.weight"])
    assert resumed.tracker.buffers.keys() == trainer.tracker.buffers.keys()
    resumed.train()
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [0, 1, 2]

    with pytest.raises(ValueError, match="lora_rank"):
        make_trainer(tokenizer, tmp_path, epochs=4, lora_rank=2)


def test_lora_starts_at_the_reference_and_merges(tokenizer, tmp_path):
    trainer = make_trainer(tokenizer, tmp_path, lora_rank=2, epochs=1)
    names = {name for name, p in trainer.dalle.named_parameters() if p.requires_grad}
    assert names and all(".lora_" in name for name in names)
    trainer.train()
    text = trainer.tokenize(PROMPTS[:2])
    tokens = torch.randint(0, 16, (2, 16))
    with torch.no_grad():
        adapted = trainer.dalle.logits(text, tokens)
        merged = trainer.merged_model().logits(text, tokens)
    torch.testing.assert_close(adapted, merged, atol=1e-5, rtol=1e-5)
    assert (trainer.reference_logprobs(text, tokens) - torch.log_softmax(adapted, -1)).abs().max() > 0


def test_trainable_blocks_moves_only_the_transformer_blocks(tokenizer, tmp_path):
    trainer = make_trainer(tokenizer, tmp_path, trainable="blocks", epochs=1)
    before = {name: p.detach().clone() for name, p in trainer.dalle.named_parameters()}
    trainer.train()
    moved = {name for name, p in trainer.dalle.named_parameters() if not torch.equal(p, before[name])}
    assert moved and all(name.startswith("transformer.") for name in moved)
    assert not any(name.startswith(("to_image_logits", "image_emb")) for name in moved)  # the frozen heads
    with pytest.raises(ValueError, match="trainable must be one of all, blocks, not 'heads'"):
        AlignConfig(trainable="heads")


def test_conditional_gumbel_keeps_the_sampled_token_on_top():
    logprobs = torch.log_softmax(torch.randn(3, 5, 9), -1)
    logprobs[0, 0, :4] = float("-inf")  # a filtered support
    tokens = torch.randint(4, 9, (3, 5))
    perturbed = RB.conditional_gumbel(logprobs, tokens, torch.Generator().manual_seed(0))
    assert torch.equal(perturbed.argmax(-1), tokens)
    assert torch.isinf(perturbed[0, 0, :4]).all()


def test_gumbel_path_passes_gradient_only_through_the_last_k_tokens(tokenizer):
    dalle = tiny_dalle(tokenizer)
    config = AlignConfig(method="reward_backprop", backprop_last_k=3, temperature=0.9)
    text = tokenizer.tokenize(PROMPTS[:2], 16)
    tokens, _ = dalle.generate_images(text, return_tokens=True, return_logprobs=True)
    _, processed, _ = policy_logprobs(dalle, text, tokens, config)
    processed.retain_grad()
    relaxed = RB.straight_through_tokens(processed, tokens, 3, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(relaxed.detach(), F.one_hot(tokens, 16).float())  # forward value = the sample
    images = dalle.vae.decode_soft(relaxed)
    torch.testing.assert_close(images.detach(), dalle.vae.decode(tokens))
    brightness(images).sum().backward()
    per_position = processed.grad.abs().sum(-1)
    assert (per_position[:, :-3] == 0).all()
    assert (per_position[:, -3:] > 0).all()
    assert dalle.to_image_logits.weight.grad.abs().sum() > 0


def test_reward_backprop_epoch_improves_a_differentiable_reward_and_refuses_jpeg(tokenizer, tmp_path):
    trainer = make_trainer(tokenizer, tmp_path / "bp", cls=RB.RewardBackpropTrainer, method="reward_backprop",
                           backprop_last_k=16, train_batch_size=6, lr=3e-2, epochs=4, kl_coef=0.0)
    history = trainer.train()
    assert history[-1]["reward_mean"] > history[0]["reward_mean"]
    assert "kl_ref_image" not in history[0]  # kl_coef 0: no reference model
    from dalle_lab.rewards import jpeg_compressibility

    with pytest.raises(ValueError, match="differentiable"):
        make_trainer(tokenizer, tmp_path / "jpeg", cls=RB.RewardBackpropTrainer, method="reward_backprop",
                     reward=jpeg_compressibility)


class ToyScorer(nn.Module):
    """A reward model with its own precision setting, like the AestheticScorer: in bf16 it is off by +0.5."""

    def __init__(self):
        super().__init__()
        self.precision = "fp32"

    def forward(self, images, prompts=None):
        score = images.float().mean(dim=(1, 2, 3))
        return score + 0.5 if self.precision != "fp32" else score


def test_low_precision_reward_logs_its_gap_to_fp32_and_warns(tokenizer, tmp_path):
    scorer = ToyScorer()

    def toy_reward(images, prompts=None):
        return scorer(images, prompts)

    toy_reward.scorer = scorer
    trainer = make_trainer(tokenizer, tmp_path, reward=toy_reward, reward_precision="bf16", reward_gap_fraction=0.5)
    assert scorer.precision == "bf16"  # the trainer scores in the requested precision
    with pytest.warns(UserWarning, match="disagrees with float32"):
        log = trainer.train_epoch(trainer.epoch_prompts(0))
    assert log["reward_gap"] == pytest.approx(0.5, abs=1e-5) and log["reward_gap_n"] == 3
    with pytest.raises(ValueError, match="precision"):
        make_trainer(tokenizer, tmp_path / "b", reward=brightness, reward_precision="bf16")


def test_evaluate_model_reports_reward_checker_and_zero_kl_against_itself(tokenizer):
    import copy

    from dalle_lab.align.evaluate import evaluate_model, improvement_in_se

    dalle = tiny_dalle(tokenizer)
    prompts = [PROMPTS[0]] * 3 + [PROMPTS[1]] * 3
    result = evaluate_model(dalle, tokenizer, prompts, brightness, AlignConfig(), seed=5,
                            reference=copy.deepcopy(dalle), batch_size=4)
    assert result["n"] == 6 and result["images"].shape == (6, 3, 16, 16)
    assert 0 <= result["checker_accuracy"] <= 1 and 0 <= result["exact_match"] <= 1
    assert abs(result["kl_ref_image"]) < 1e-5
    again = evaluate_model(dalle, tokenizer, prompts, brightness, AlignConfig(), seed=5, shapes=False, batch_size=4)
    assert again["reward_mean"] == pytest.approx(result["reward_mean"])  # same seed, same samples
    better = dict(again, reward_mean=again["reward_mean"] + 3 * 2 ** 0.5 * again["reward_se"])
    assert improvement_in_se(again, better) == pytest.approx(3.0)


def test_time_budget_stops_before_an_epoch_that_would_overrun(tokenizer, tmp_path):
    trainer = make_trainer(tokenizer, tmp_path, epochs=5, inner_epochs=1, time_budget_s=1e-6)
    history = trainer.train()
    assert len(history) == 1  # the first epoch runs; its duration says a second one would overrun the budget
