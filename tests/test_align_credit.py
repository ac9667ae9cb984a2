"""Credit for the policy gradient: the Shapes checker's credit maps (each attribute to the cells that decided it),
rewards with and without maps, per-token advantages (uniform credit is the special case of all-one maps, group and
batch std, flat groups), the per-token PPO loss, content credit, and a trainer that credits where the map points."""
import numpy as np
import pytest
import torch

from dalle_lab.align.config import AlignConfig
from dalle_lab.align.credit import content_cells, content_map, credited_scores, token_advantages
from dalle_lab.align.policy_gradient import ppo_clipped_loss
from dalle_lab.align.stat_tracking import group_normalize
from dalle_lab.data.checker import attribute_cells, check
from dalle_lab.data.shapes import Placement, Scene, parse, render, to_tensor
from dalle_lab.rewards import brightness, get_reward, shapes_faithfulness
from dalle_lab.rewards.credit import CreditedScores, score_with_credit

from test_align_finetune import make_trainer, tokenizer  # noqa: F401  (the fixture)

ONE = "a small red circle at the top left on a white background"
TWO = "an orange square above a blue triangle on a gray background"


def draw(caption, *placements):
    return to_tensor(render(Scene(parse(caption), tuple(Placement(*p) for p in placements)), 32))


def cells(rows, cols):
    grid = np.zeros((8, 8), bool)
    grid[rows, cols] = True
    return grid


def test_each_attribute_is_credited_to_the_cells_that_decided_it():
    image = draw(ONE, (0.17, 0.17, 0.22))  # the circle spans x, y in [0.06, 0.28]: cells 0-2 of the 8x8 grid
    maps = attribute_cells(check(image, ONE), ONE, 8)
    assert set(maps) == {"color", "shape", "size", "place", "background"}
    for name in ("color", "shape", "size"):  # the object's cells and a one-cell border
        assert np.array_equal(maps[name], cells(slice(0, 4), slice(0, 4))), name
    assert np.array_equal(maps["place"], cells(slice(0, 3), slice(0, 3)))
    assert np.array_equal(maps["background"], ~cells(slice(0, 3), slice(0, 3)))
    # two objects, the second missing (blank where the caption wants a blue triangle): its verdicts point nowhere in
    # particular, so they get every cell; the first object's verdicts keep their own cells
    image = draw("an orange square above a green circle on a gray background", (0.5, 0.25, 0.29), (0.55, 0.72, 0.29))
    image[:, 16:, :] = 128 / 255  # paint the lower object over with the background
    maps = attribute_cells(check(image, TWO), TWO, 8)
    assert maps["color2"].all() and maps["shape2"].all() and maps["relation"].all()
    # the square spans x in [0.355, 0.645] (cells 2-5), y in [0.105, 0.395] (cells 0-3), and a one-cell border
    assert np.array_equal(maps["color1"], cells(slice(0, 5), slice(1, 7)))


def test_shapes_rewards_split_their_score_into_credited_parts():
    right = draw(ONE, (0.17, 0.17, 0.22))
    wrong_place = draw(ONE.replace("top left", "bottom right"), (0.83, 0.83, 0.22))
    images, prompts = torch.stack([right, wrong_place]), [ONE, ONE]
    credited = score_with_credit(shapes_faithfulness, images, prompts, 64)
    torch.testing.assert_close(credited.scores, shapes_faithfulness(images, prompts))
    torch.testing.assert_close(credited.parts.sum(1), credited.scores)
    assert credited.parts.shape == (2, 6) and credited.maps.shape == (2, 6, 64)
    assert credited.parts[1, 3] == 0 and credited.parts[0, 3] == pytest.approx(0.2)  # "place" (4th) failed
    assert credited.maps[1, 3].reshape(8, 8)[6:, 6:].all() and credited.maps[1, 3].sum() == 9  # where it was drawn
    assert credited.maps[:, 5].sum() == 0  # a one-object caption has five parts: the sixth is padding
    exact = score_with_credit(get_reward("shapes_exact"), images, prompts, 64)
    assert exact.parts[:, 0].tolist() == [1.0, 0.0]
    assert torch.equal(exact.maps[1, 0], credited.maps[1, 3])  # the miss is credited where the failed verdict looked
    # a weighted sum keeps each term's parts side by side; a term without maps is credited to every token
    mixed = score_with_credit(get_reward("shapes_faithfulness:2+brightness:0.5"), images, prompts, 64)
    assert mixed.parts.shape == (2, 7)
    torch.testing.assert_close(mixed.scores, 2 * credited.scores + 0.5 * brightness(images, prompts))
    torch.testing.assert_close(mixed.parts[:, :6], 2 * credited.parts)
    assert mixed.maps[:, 6].eq(1).all()


def test_all_one_maps_give_the_group_advantage_on_every_token():
    prompts = ["a", "a", "a", "b", "b", "b"]
    parts = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 1.0], [1.0, 1.0], [0.0, 1.0]])
    scores = parts.sum(1)
    for std in ("group", "batch"):
        credited = CreditedScores(scores, parts, torch.ones(6, 2, 4))
        advantages, informative = token_advantages(prompts, credited, std)
        expected = group_normalize(prompts, scores.numpy(), std=std)
        torch.testing.assert_close(advantages, torch.as_tensor(expected, dtype=torch.float32)[:, None].expand(6, 4))
        assert informative.all()
    # batch std: one scale for every sample (group "b" is normalised by the batch's std, not its own)
    batch = group_normalize(prompts, scores.numpy(), std="batch")
    np.testing.assert_allclose(batch, (scores.numpy() - np.repeat([4 / 3, 5 / 3], 3)) / scores.numpy().std(),
                               rtol=1e-5)


def test_localized_advantages_credit_each_part_to_its_tokens_and_flat_groups_are_marked():
    prompts = ["a", "a", "b", "b"]
    parts = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 1.0]])  # group "b" has no spread
    maps = torch.zeros(4, 2, 3)
    maps[:, 0, 0] = 1  # part 0 is about token 0, part 1 about token 2
    maps[:, 1, 2] = 1
    advantages, informative = token_advantages(prompts, CreditedScores(parts.sum(1), parts, maps), "group")
    scale = 1 / (0.5 + 1e-6)  # group "a": rewards 1, 0 -> std 0.5
    torch.testing.assert_close(advantages[:2], torch.tensor([[0.5 * scale, 0, 0], [-0.5 * scale, 0, 0]]))
    assert advantages[2:].abs().max() == 0 and informative.tolist() == [True, True, False, False]
    clipped, _ = token_advantages(prompts, CreditedScores(parts.sum(1), parts, maps), "group", clip=0.5)
    assert clipped.abs().max() == pytest.approx(0.5)


def test_per_token_ppo_loss_moves_only_tokens_with_an_advantage():
    old = torch.zeros(2, 4)
    new = (0.1 * torch.randn(2, 4, generator=torch.Generator().manual_seed(1))).requires_grad_()
    advantages = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, -0.5, -0.5]])
    loss, _ = ppo_clipped_loss(new, old, advantages, 0.2)
    loss.backward()
    assert torch.equal(new.grad == 0, advantages == 0)
    per_image = torch.tensor([1.0, -0.5])
    a, _ = ppo_clipped_loss(new.detach(), old, per_image, 0.2)
    b, _ = ppo_clipped_loss(new.detach(), old, per_image[:, None].expand(2, 4), 0.2)
    assert a.item() == pytest.approx(b.item())


def scene(background=(1.0, 1.0, 1.0)):
    """A 32x32 image of one background colour with a red 8x8 square at rows 8-15, columns 4-11."""
    image = torch.tensor(background).view(1, 3, 1, 1).repeat(1, 1, 32, 32)
    image[:, :, 8:16, 4:12] = torch.tensor([0.9, 0.1, 0.1]).view(1, 3, 1, 1)
    return image


def test_content_credit_is_the_cells_the_object_covers():
    expected = torch.zeros(8, 8, dtype=torch.bool)
    expected[2:4, 1:3] = True  # 4-pixel cells: rows 8-15 -> cells 2-3, columns 4-11 -> cells 1-2
    assert torch.equal(content_cells(scene(), grid=8).reshape(8, 8), expected)
    dark = scene((0.1, 0.1, 0.3)) + 0.04 * torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(content_cells(dark, grid=8).reshape(8, 8), expected)  # faint noise is not content
    images = torch.cat([scene(), torch.ones(1, 3, 32, 32)])  # the second image shows nothing: uniform credit
    assert content_map(images, 64).sum(1).tolist() == [4, 64]
    credited = credited_scores(brightness, images, ["x", "y"], 64, "content")
    assert torch.equal(credited.maps[:, 0], content_map(images, 64))
    with pytest.raises(ValueError, match="credit must be one of uniform, localized, content, not 'object'"):
        credited_scores(brightness, images, ["x", "y"], 64, "object")
    with pytest.raises(ValueError, match="square token grid"):
        content_map(images, 60)
    with pytest.raises(ValueError, match="credit='localized' splits group advantages over tokens"):
        AlignConfig(credit="localized", advantage="per_prompt")


def half_credit_reward(images, prompts=None):
    return brightness(images, prompts)


def _half_credit(images, prompts, num_tokens):
    """Brightness, credited to the first half of the tokens only."""
    scores = brightness(images, prompts).float()
    maps = torch.zeros(len(scores), 1, num_tokens)
    maps[:, :, :num_tokens // 2] = 1
    return CreditedScores(scores, scores[:, None], maps)


half_credit_reward.credit = _half_credit


def test_the_trainer_credits_where_the_reward_map_points(tokenizer, tmp_path):  # noqa: F811
    trainer = make_trainer(tokenizer, tmp_path, credit="localized", advantage="group", inner_epochs=1,
                           reward=half_credit_reward, drop_flat_groups=True)
    prompts = trainer.epoch_prompts(0)
    batch = trainer.collect(prompts)
    advantages, informative = trainer.advantages(prompts, batch)
    assert advantages[:, 8:].abs().max() == 0 and advantages[:, :8].abs().max() > 0  # 16 tokens: first half only
    torch.testing.assert_close(advantages[:, 0], torch.as_tensor(
        group_normalize(prompts, batch["rewards"].numpy(), std=trainer.config.adv_std), dtype=torch.float32).clamp(-5, 5))
    before = {n: p.detach().clone() for n, p in trainer.dalle.named_parameters()}
    log = trainer.train_epoch(prompts)
    assert log["max_abs_logratio_first_step"] < 2e-5 and log["updated_images"] == int(informative.sum())
    assert any(not torch.equal(p, before[n]) for n, p in trainer.dalle.named_parameters())


def test_a_reward_must_give_one_finite_score_per_image():
    """A NaN or inf score would make the advantages, the loss and every weight NaN: refused naming the caption."""
    import math

    from dalle_lab.align.credit import checked_scores

    prompts = ["a red circle", "a blue square"]
    assert checked_scores([1, 2.5], prompts).tolist() == [1.0, 2.5]  # a list is fine
    for bad, message in (([1.0, math.nan], "returned nan for the image of 'a blue square'"),
                         (torch.tensor([math.inf, 0.0]), "returned inf for the image of 'a red circle'"),
                         ([1.0, 2.0, 3.0], r"shape \(3,\) for 2 images"), ("ten", "not one number per image")):
        with pytest.raises(ValueError, match=message):
            checked_scores(bad, prompts)
