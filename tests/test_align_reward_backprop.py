"""Reward backprop as AlignProp does it (issue 14 section 2): every reward precision works, the randomised truncation
draws K per step."""
import pytest
import torch
from torch import nn

from dalle_lab.align.config import AlignConfig
from dalle_lab.align.reward_backprop import RewardBackpropTrainer

from test_align_finetune import PROMPTS, tiny_dalle  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    from dalle_lab.tokenizers import get_tokenizer

    return get_tokenizer()


def tiny_clip_reward():
    """The aesthetic reward's real architecture at toy size: a CLIP vision tower (transformers) and a linear head."""
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    from dalle_lab.rewards.aesthetic import AestheticHead, AestheticScorer

    config = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              image_size=16, patch_size=4, projection_dim=8, hidden_act="quick_gelu")
    torch.manual_seed(0)
    vision = CLIPVisionModelWithProjection._from_config(config, attn_implementation="sdpa").eval()
    head = AestheticHead(8)
    scorer = AestheticScorer(vision, head=head)

    def reward(images, prompts=None):
        return scorer(images).float().reshape(-1)

    reward.scorer, reward.differentiable = scorer, True
    return reward


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16", "tpu_default"])
def test_reward_backprop_runs_with_a_clip_reward_in_every_precision(tokenizer, tmp_path, precision):
    reward = tiny_clip_reward()
    config = AlignConfig(method="reward_backprop", epochs=1, prompts_per_epoch=2, group_size=2, sample_batch_size=4,
                         train_batch_size=4, lr=1e-3, backprop_last_k=8, reward_precision=precision,
                         reward_gap_fraction=0.5, reward_gap_warn=10.0)
    dalle = tiny_dalle(tokenizer)
    before = {k: v.detach().clone() for k, v in dalle.named_parameters()}
    trainer = RewardBackpropTrainer(dalle, tokenizer, config, PROMPTS, tmp_path, reward=reward,
                                    log_fn=lambda _: None)
    log = trainer.train_epoch(trainer.epoch_prompts(0))
    assert log["grad_norm"] > 0 and torch.isfinite(torch.tensor(log["grad_norm"]))
    moved = max((p.detach() - before[k]).abs().max().item() for k, p in dalle.named_parameters())
    assert moved > 0
    if precision != "fp32":
        assert "reward_gap" in log
    # the reward model is back to float32, weights untouched
    assert all(p.dtype == torch.float32 for p in reward.scorer.parameters())


# ------------------------------------------------------------------ the chain inside the window

def _chain_setup(tokenizer, last_k=4):
    from dalle_lab.align.logprobs import sample_with_support

    dalle = tiny_dalle(tokenizer).eval()
    config = AlignConfig(method="reward_backprop", backprop_last_k=last_k, temperature=0.9, top_k=10,
                         cond_scale=1.0)
    text = tokenizer.tokenize(PROMPTS[:2], 16)
    tokens, _, support = sample_with_support(dalle, text, config, torch.Generator().manual_seed(0))
    return dalle, config, text, tokens, support


def _noise():
    return torch.Generator().manual_seed(5)


def last_cell_reward(dalle, relaxed):
    """A reward that reads only the last grid cell (the stand-in VAE decodes token i to its own patch)."""
    return dalle.vae.decode_soft(relaxed)[:, :, -4:, -4:].sum()


@pytest.mark.parametrize("depth", [1, 2])
def test_the_last_tokens_gradient_reaches_earlier_window_logits_only_through_the_chain(tokenizer, depth):
    from dalle_lab.align.reward_backprop import relaxed_chain

    dalle, config, text, tokens, support = _chain_setup(tokenizer, last_k=4)
    relaxed, passes = relaxed_chain(dalle, text, tokens, config, support, 4, depth, _noise)
    first = passes[0][0]
    first.retain_grad()
    torch.testing.assert_close(relaxed.detach(), torch.nn.functional.one_hot(tokens, 16).float())  # value unchanged
    last_cell_reward(dalle, relaxed).backward()
    per_position = first.grad.abs().sum(-1)  # (B, N): gradient reaching the first pass's logits
    n = tokens.shape[1]
    assert (per_position[:, : n - 4] == 0).all()  # before the window: constants
    if depth == 1:  # own logits only: nothing but the last position
        assert (per_position[:, n - 4: n - 1] == 0).all() and (per_position[:, -1] > 0).all()
    else:  # the last token's logits saw the window's earlier tokens as relaxed inputs
        assert (per_position[:, n - 4: n - 1] > 0).all()


def _sequential_unroll(dalle, config, text, tokens, support, last_k):
    """The reference: build the window's relaxations one position at a time, each from a pass whose inputs are
    the relaxations built so far (what unrolling the sampler with gradients does)."""
    from dalle_lab.align.logprobs import policy_logprobs
    from dalle_lab.align.reward_backprop import relaxed_image_inputs, straight_through_tokens

    n = tokens.shape[1]
    start = n - last_k
    hard = torch.nn.functional.one_hot(tokens, 16).float()
    built = []
    for j in range(start, n):
        current = torch.cat([hard[:, :start], *[r.unsqueeze(1) for r in built], hard[:, j:]], dim=1)
        with relaxed_image_inputs(dalle, current, start):
            _, processed, _ = policy_logprobs(dalle, text, tokens, config, support)
        tail = straight_through_tokens(processed, tokens, last_k, config.gumbel_tau, _noise())
        built.append(tail[:, j])
    return torch.cat([hard[:, :start], torch.stack(built, dim=1)], dim=1)


@pytest.mark.parametrize("checkpoint", [False, True])
def test_the_whole_chain_equals_unrolling_the_window_one_token_at_a_time(tokenizer, checkpoint):
    from dalle_lab.align.reward_backprop import relaxed_chain

    dalle, config, text, tokens, support = _chain_setup(tokenizer, last_k=4)
    params = [p for p in dalle.parameters()]

    def grads(relaxed):
        dalle.zero_grad(set_to_none=True)
        (dalle.vae.decode_soft(relaxed) * torch.linspace(0, 1, 16 * 16).view(1, 1, 16, 16)).sum().backward()
        return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]

    reference = grads(_sequential_unroll(dalle, config, text, tokens, support, 4))
    chain = grads(relaxed_chain(dalle, text, tokens, config, support, 4, 4, _noise, checkpoint=checkpoint)[0])
    shallow = grads(relaxed_chain(dalle, text, tokens, config, support, 4, 1, _noise)[0])
    for a, b in zip(chain, reference):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert max((a - b).abs().max().item() for a, b in zip(shallow, reference)) > 1e-4  # depth matters


def test_randomised_truncation_draws_k_per_step_within_the_range(tokenizer, tmp_path):
    config = AlignConfig(method="reward_backprop", backprop_last_k=12, backprop_last_k_min=3)
    from dalle_lab.rewards import brightness

    trainer = RewardBackpropTrainer(tiny_dalle(tokenizer), tokenizer, config, PROMPTS, tmp_path, reward=brightness,
                                    log_fn=lambda _: None)
    draws = [trainer.truncation(step) for step in range(40)]
    assert min(draws) >= 3 and max(draws) <= 12 and len(set(draws)) > 4
    assert draws == [trainer.truncation(step) for step in range(40)]  # a function of (seed, epoch, step)
    with pytest.raises(ValueError, match="backprop_last_k_min"):
        AlignConfig(backprop_last_k=4, backprop_last_k_min=5)
