"""Token credit for the policy gradient (dalle_lab/align/credit.py): which cells count as content, and the weighted
PPO loss that gives the advantage to those tokens only."""
import pytest
import torch

from dalle_lab.align.config import AlignConfig
from dalle_lab.align.credit import content_cells, token_credit
from dalle_lab.align.policy_gradient import ppo_clipped_loss

from test_align_finetune import make_trainer, tokenizer  # noqa: F401  (the fixture)


def scene(background=(1.0, 1.0, 1.0)):
    """A 32x32 image of one background colour with a red 8x8 square at rows 8-15, columns 4-11."""
    image = torch.tensor(background).view(1, 3, 1, 1).repeat(1, 1, 32, 32)
    image[:, :, 8:16, 4:12] = torch.tensor([0.9, 0.1, 0.1]).view(1, 3, 1, 1)
    return image


def test_content_cells_are_the_cells_the_object_covers():
    cells = content_cells(scene(), grid=8).reshape(8, 8)
    expected = torch.zeros(8, 8, dtype=torch.bool)
    expected[2:4, 1:3] = True  # 4-pixel cells: rows 8-15 -> cells 2-3, columns 4-11 -> cells 1-2
    assert torch.equal(cells, expected)
    # on a dark background too, and faint noise below the threshold is not content
    dark = scene((0.1, 0.1, 0.3)) + 0.04 * torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(content_cells(dark, grid=8).reshape(8, 8), expected)


def test_token_credit_kinds_and_the_empty_image():
    images = torch.cat([scene(), torch.ones(1, 3, 32, 32)])  # the second image shows nothing
    credit = token_credit(images, 64, "content")
    assert credit[0].sum() == 4 and credit[1].sum() == 64  # nothing drawn: uniform, so it can still be penalised
    assert torch.equal(token_credit(images, 64, "uniform"), torch.ones(2, 64))
    with pytest.raises(ValueError, match="token credit must be one of uniform, content, not 'object'"):
        token_credit(images, 64, "object")
    with pytest.raises(ValueError, match="square token grid"):
        token_credit(images, 60, "content")
    with pytest.raises(ValueError, match="token_credit must be one of"):
        AlignConfig(token_credit="pixels")


def test_weighted_ppo_loss_is_the_weighted_mean_and_skips_zero_weight_tokens():
    old = torch.zeros(2, 4)
    new = (0.1 * torch.randn(2, 4, generator=torch.Generator().manual_seed(1))).requires_grad_()
    advantages = torch.tensor([1.0, -0.5])
    weights = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 1.0]])
    loss, _ = ppo_clipped_loss(new, old, advantages, 0.2, weights)
    loss.backward()
    assert torch.equal(new.grad == 0, weights == 0)
    ratio = new.detach().exp()
    per_token = torch.maximum(-advantages[:, None] * ratio, -advantages[:, None] * ratio.clamp(0.8, 1.2))
    assert loss.item() == pytest.approx((per_token * weights).sum().item() / 4)
    plain, _ = ppo_clipped_loss(new.detach(), old, advantages, 0.2, torch.ones(2, 4))
    assert plain.item() == pytest.approx(per_token.mean().item())


def test_the_trainer_credits_content_tokens(tokenizer, tmp_path):  # noqa: F811
    trainer = make_trainer(tokenizer, tmp_path, token_credit="content", inner_epochs=1)
    prompts = trainer.epoch_prompts(0)
    batch = trainer.collect(prompts)
    expected = token_credit(trainer.dalle.vae.decode(batch["tokens"]), batch["tokens"].shape[1], "content")
    assert torch.equal(batch["credit"], expected)
    log = trainer.train_epoch(prompts)
    assert log["max_abs_logratio_first_step"] < 2e-5
