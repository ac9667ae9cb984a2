"""Rewards on tiny inputs: JPEG sizes, the differentiable proxy, composition, the command-line spec, the worker."""
import numpy as np
import pytest
import torch

import dalle_lab.rewards as R


def _flat_and_noisy(size=32):
    generator = torch.Generator().manual_seed(0)
    flat = torch.full((1, 3, size, size), 0.5)
    noisy = torch.rand((1, 3, size, size), generator=generator)
    return torch.cat([flat, noisy])


def test_jpeg_sizes_flat_image_is_smaller_than_noise():
    images = _flat_and_noisy()
    sizes = R.jpeg_size_kb(images)
    assert sizes[0] < sizes[1] / 2
    assert np.all(sizes > 0.1)  # even a flat JPEG carries headers of a few hundred bytes
    compress = R.jpeg_compressibility(images, ["a", "b"])
    incompress = R.jpeg_incompressibility(images, ["a", "b"])
    assert compress.dtype == torch.float32 and compress.shape == (2,)
    assert compress[0] > compress[1]
    torch.testing.assert_close(compress, -incompress)
    np.testing.assert_allclose(-compress.numpy(), sizes, rtol=1e-6)


def test_jpeg_accepts_uint8_hwc_and_matches_float_input():
    images = _flat_and_noisy()
    as_uint8 = (images.permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)
    np.testing.assert_allclose(R.jpeg_size_kb(as_uint8), R.jpeg_size_kb(images))


def test_negative_total_variation_orders_like_jpeg_and_has_gradients():
    images = _flat_and_noisy().requires_grad_(True)
    scores = R.negative_total_variation(images, None)
    assert scores[0].item() == 0.0 and scores[1].item() < -20
    scores.sum().backward()
    assert images.grad is not None and images.grad[1].abs().sum() > 0
    assert R.is_differentiable(R.negative_total_variation)
    assert not R.is_differentiable(R.jpeg_compressibility)


def test_weighted_sum_and_spec_parsing():
    images = _flat_and_noisy()
    combined = R.get_reward("jpeg_compressibility:2+brightness:0.5")
    expected = 2 * R.jpeg_compressibility(images) + 0.5 * R.brightness(images)
    torch.testing.assert_close(combined(images, ["a", "b"]), expected)
    assert not R.is_differentiable(combined)
    assert R.is_differentiable(R.get_reward("negative_total_variation:1+brightness:3"))
    assert R.get_reward("jpeg_compressibility") is R.jpeg_compressibility
    with pytest.raises(ValueError, match="unknown reward 'jpeg'"):
        R.get_reward("jpeg")
    with pytest.raises(ValueError, match="clip"):
        R.get_reward("aesthetic")
    with pytest.raises(ValueError, match="must be a number"):
        R.get_reward("brightness:x")


def test_user_callable_passes_through_and_worker_overlaps():
    def red(images, prompts):
        return images[:, 0].mean(dim=(1, 2))

    assert R.get_reward(red) is red
    images = _flat_and_noisy()
    with R.RewardWorker(red) as worker:
        future = worker.submit(images, ["x", "y"])
        torch.testing.assert_close(future.result(timeout=300), red(images, None))


def test_bad_image_shape_is_named():
    with pytest.raises(ValueError, match="batch of images"):
        R.jpeg_size_kb(torch.rand(3, 8, 8))


def test_aesthetic_reward_wraps_the_scorer_differentiably():
    """Wiring only (the head's real scores are tested in test_aesthetic.py): a tiny random CLIP tower + the LAION head."""
    import os
    from pathlib import Path

    from dalle_lab.rewards.aesthetic import random_clip_vision, vit_l14_vision_config

    assets = os.environ.get("DALLE_LAB_AESTHETIC_ASSETS", Path(__file__).resolve().parents[2] / "shared" / "assets" /
                            "aesthetic")  # the same shared copy test_aesthetic.py uses
    head = Path(assets) / "sac+logos+ava1-l14-linearMSE.pth"
    if not head.is_file():
        pytest.skip(f"the LAION head is not at {head}")
    tiny = random_clip_vision(vit_l14_vision_config(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                    num_attention_heads=2, image_size=28, patch_size=14))
    reward = R.get_reward("aesthetic:2", clip_path=tiny, head_path=str(head))
    images = _flat_and_noisy().requires_grad_(True)
    scores = reward(images, ["a", "b"])
    assert scores.shape == (2,) and torch.isfinite(scores).all()
    assert R.is_differentiable(reward)
    scores.sum().backward()
    assert images.grad.abs().sum() > 0


def test_group_diversity_is_the_mean_distance_to_the_caption_group():
    from dalle_lab.rewards import get_reward
    from dalle_lab.rewards.builtin import group_diversity

    images = torch.zeros(5, 3, 4, 4)
    images[1] = 1.0  # differs from image 0 by 1 everywhere
    images[2, 0] = 0.5  # one channel of three at 0.5: mean difference 1/6 to image 0, (1 - 1/6) to image 1
    images[4] = 0.25  # alone with its caption
    prompts = ["a", "a", "a", "b", "c"]
    scores = group_diversity(images, prompts)
    d01, d02, d12 = 1.0, 0.5 / 3, (0.5 + 1 + 1) / 3
    expected = torch.tensor([(d01 + d02) / 2, (d01 + d12) / 2, (d02 + d12) / 2, 0.0, 0.0])
    assert torch.allclose(scores, expected, atol=1e-6)
    combined = get_reward("brightness+group_diversity:2")
    assert torch.allclose(combined(images, prompts), images.mean(dim=(1, 2, 3)) + 2 * expected, atol=1e-6)
    with pytest.raises(ValueError, match="group_diversity needs one caption per image"):
        group_diversity(images, None)
