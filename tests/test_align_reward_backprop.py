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
