"""The diversity bonus among each group's best samples (dalle_lab/align/diversity_bonus.py): its formula, that it
sums to zero in every group and leaves the rest alone, and that the trainer adds it as one more credited part."""
import pytest
import torch

from dalle_lab.align.config import AlignConfig
from dalle_lab.align.diversity_bonus import best_sample_diversity, scoring_with_bonus, with_diversity_bonus
from dalle_lab.rewards.credit import uniform_credit

from test_align_finetune import make_trainer, tokenizer  # noqa: F401  (the fixture)


def test_bonus_is_the_centred_mean_distance_among_the_best():
    images = torch.zeros(6, 3, 2, 2)
    images[1] = 1.0
    images[2, 0] = 0.5  # mean difference 1/6 to image 0, 5/6 to image 1
    images[3] = 0.7  # the group's worst: no bonus, and not a partner of the best
    images[4] = 0.3  # alone at the top of its group
    prompts = ["a", "a", "a", "a", "b", "b"]
    scores = torch.tensor([1.0, 1.0, 1.0, 0.4, 0.9, 0.2])
    bonus = best_sample_diversity(images, prompts, scores)
    d01, d02, d12 = 1.0, 1 / 6, 5 / 6
    means = torch.tensor([(d01 + d02) / 2, (d01 + d12) / 2, (d02 + d12) / 2])
    expected = torch.cat([means - means.mean(), torch.zeros(3)])
    torch.testing.assert_close(bonus, expected, atol=1e-6, rtol=0)
    assert abs(float(bonus[:4].sum())) < 1e-6


def test_the_bonus_is_one_more_uniform_part_and_weight_zero_changes_nothing():
    images = torch.rand(4, 3, 4, 4, generator=torch.Generator().manual_seed(0))
    prompts, scores = ["a"] * 4, torch.ones(4)
    credited = uniform_credit(scores, 16)
    plus = with_diversity_bonus(credited, images, prompts, 3.0)
    bonus = best_sample_diversity(images, prompts, scores)
    torch.testing.assert_close(plus.scores, scores + 3.0 * bonus)
    torch.testing.assert_close(plus.parts[:, 1], 3.0 * bonus)
    assert plus.maps.shape == (4, 2, 16) and bool((plus.maps[:, 1] == 1).all())
    assert scoring_with_bonus(images, prompts, lambda i, p: credited, 0.0) is credited


def test_a_negative_weight_is_named():
    with pytest.raises(ValueError, match="diversity_weight must be >= 0 \\(0 turns the bonus off\\), got -1.0"):
        AlignConfig(diversity_weight=-1.0)


def constant_reward(images, prompts=None):
    return torch.zeros(len(images))


def test_the_trainer_turns_flat_groups_of_equally_good_images_informative(tokenizer, tmp_path):  # noqa: F811
    flat = make_trainer(tokenizer, tmp_path / "off", reward=constant_reward, advantage="group", credit="uniform",
                        sample_batch_size=6)
    prompts = flat.epoch_prompts(0)
    assert not flat.advantages(prompts, flat.collect(prompts))[1].any()  # all groups flat: nothing to learn
    trainer = make_trainer(tokenizer, tmp_path / "on", reward=constant_reward, advantage="group", credit="uniform",
                           sample_batch_size=6, diversity_weight=2.0)
    batch = trainer.collect(prompts)
    assert batch["reward_parts"].shape[1] == 2
    for prompt in set(prompts):
        group = [i for i, p in enumerate(prompts) if p == prompt]
        assert abs(float(batch["rewards"][group].sum())) < 1e-5 and float(batch["rewards"][group].abs().max()) > 0
    assert trainer.advantages(prompts, batch)[1].all()


def test_groups_split_over_sampling_batches_are_said_at_the_start(tokenizer, tmp_path):  # noqa: F811
    from test_align_finetune import PROMPTS, tiny_dalle

    from dalle_lab.align.policy_gradient import PolicyGradientTrainer

    said = []
    for batch, out in ((4, "split"), (6, "whole")):
        config = AlignConfig(epochs=1, prompts_per_epoch=2, group_size=3, sample_batch_size=batch, train_batch_size=3,
                             eval_num_prompts=0, eval_num_heldout=0)
        PolicyGradientTrainer(tiny_dalle(tokenizer), tokenizer, config, PROMPTS, tmp_path / out,
                              reward=constant_reward, log_fn=said.append)
        said.append("--")
    notes = " ".join(said).split("--")
    assert "sample_batch_size 4 splits groups of 3" in notes[0] and "splits groups" not in notes[1]
