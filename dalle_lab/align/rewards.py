"""Rewards: plain functions `reward(images, prompts) -> scores`.

`images` are decoded pixels, a float tensor (B, 3, H, W) in [0, 1] (what `vae.decode` returns); `prompts` is a list of
B captions. A reward returns a float32 tensor of B scores on the images' device. Higher is better.

Two kinds:
- score-only rewards (JPEG size, the Shapes checker, the aesthetic predictor, any user callable) feed the
  policy-gradient trainer, which never differentiates through them;
- differentiable rewards (marked `reward.differentiable = True`, built from torch ops only) can also drive reward
  backpropagation (reward_backprop.py).

`get_reward("jpeg_compressibility")` or `get_reward("jpeg_compressibility:1+shapes_faithfulness:0.5")` builds one
from the command line; `weighted_sum({...})` composes callables in code. `RewardWorker` computes rewards in a
background thread so scoring one batch overlaps with sampling the next, as DDPO does.
"""
from __future__ import annotations

import io
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Mapping, Sequence

import numpy as np

RewardFn = Callable[..., "object"]  # (images, prompts) -> tensor of B scores

JPEG_QUALITY = 95  # DDPO's setting: file size at quality 95, in kilobytes (1 kB = 1000 bytes)


def _as_uint8_hwc(images) -> np.ndarray:
    """(B,3,H,W) float tensor in [0,1] (or an array of that shape, or (B,H,W,3) uint8) -> (B,H,W,3) uint8 array."""
    if hasattr(images, "detach"):
        images = images.detach().float().cpu().numpy()
    images = np.asarray(images)
    if images.ndim != 4:
        raise ValueError(f"a reward expects a batch of images (B,3,H,W) or (B,H,W,3); got shape {images.shape}")
    if images.dtype == np.uint8:
        return images if images.shape[-1] == 3 else images.transpose(0, 2, 3, 1)
    if images.shape[1] == 3:
        images = images.transpose(0, 2, 3, 1)
    return (np.clip(images, 0.0, 1.0) * 255.0).round().astype(np.uint8)


def _scores(values, like) -> "object":
    """Scores as float32 on the device of the input images (numpy input gives a CPU tensor)."""
    import torch

    device = like.device if hasattr(like, "device") else "cpu"
    return torch.as_tensor(np.asarray(values, dtype=np.float32), device=device)


def jpeg_size_kb(images, quality: int = JPEG_QUALITY) -> np.ndarray:
    """JPEG file size of each image at `quality`, in kB (1000 bytes)."""
    from PIL import Image

    sizes = []
    for array in _as_uint8_hwc(images):
        buffer = io.BytesIO()
        Image.fromarray(array).save(buffer, format="JPEG", quality=quality)
        sizes.append(buffer.tell() / 1000.0)
    return np.asarray(sizes, dtype=np.float64)


def jpeg_compressibility(images, prompts: Sequence[str] | None = None):
    """DDPO's compressibility reward: minus the JPEG (quality 95) file size in kB. Flat images score highest."""
    return _scores(-jpeg_size_kb(images), images)


def jpeg_incompressibility(images, prompts: Sequence[str] | None = None):
    """DDPO's incompressibility reward: the JPEG (quality 95) file size in kB. Detailed/noisy images score highest."""
    return _scores(jpeg_size_kb(images), images)


def _shapes_results(images, prompts):
    from dalle_lab.data.shapes import check

    if prompts is None or len(prompts) != len(images):
        raise ValueError("shapes rewards need one caption per image (got "
                         f"{None if prompts is None else len(prompts)} captions for {len(images)} images)")
    return [check(array, caption) for array, caption in zip(_as_uint8_hwc(images), prompts)]


def shapes_faithfulness(images, prompts: Sequence[str]):
    """Fraction of the caption's attributes (shape, colour, position, ...) the Shapes checker finds in the image."""
    return _scores([result.accuracy for result in _shapes_results(images, prompts)], images)


def shapes_exact(images, prompts: Sequence[str]):
    """1 when the Shapes checker finds every attribute of the caption, else 0 (the exact-match metric)."""
    return _scores([float(result.exact) for result in _shapes_results(images, prompts)], images)


def negative_total_variation(images, prompts: Sequence[str] | None = None):
    """Differentiable proxy for JPEG compressibility: minus the mean absolute difference between neighbouring pixels
    (horizontal and vertical averaged).

    JPEG spends its bits on high-frequency content, so an image with small neighbour differences compresses well;
    unlike the file size this is built from torch ops, so reward backpropagation can follow its gradient. Scaled by
    100 so its values (0 for a flat image, about -33 for uniform noise) sit in a range like the JPEG reward's.
    """
    import torch

    images = torch.as_tensor(images)
    dx = (images[..., :, 1:] - images[..., :, :-1]).abs().mean(dim=(1, 2, 3))
    dy = (images[..., 1:, :] - images[..., :-1, :]).abs().mean(dim=(1, 2, 3))
    return -50.0 * (dx + dy)


negative_total_variation.differentiable = True


def brightness(images, prompts: Sequence[str] | None = None):
    """Differentiable toy reward: mean pixel value in [0, 1] (useful to check a fine-tuning path moves at all)."""
    import torch

    return torch.as_tensor(images).mean(dim=(1, 2, 3))


brightness.differentiable = True


def aesthetic(clip_path: str, head_path: str | None = None, precision: str = "fp32", device=None) -> RewardFn:
    """The LAION improved aesthetic predictor as a reward (CLIP ViT-L/14 weights from a local path).

    Built by the aesthetic module (dalle_lab.align.aesthetic); this wraps its scorer in the reward signature.
    Differentiable in float32, so it can also drive reward backpropagation.
    """
    from dalle_lab.align.aesthetic import AestheticScorer

    kwargs = {"precision": precision}
    if head_path is not None:
        kwargs["head_path"] = head_path
    if device is not None:
        kwargs["device"] = device
    scorer = AestheticScorer(clip_path, **kwargs)

    def aesthetic_reward(images, prompts=None):
        return scorer(images).float().reshape(-1)

    aesthetic_reward.differentiable = True
    aesthetic_reward.scorer = scorer
    return aesthetic_reward


def is_differentiable(reward: RewardFn) -> bool:
    return bool(getattr(reward, "differentiable", False))


def weighted_sum(terms: Mapping[str, tuple[RewardFn, float]] | Sequence[tuple[RewardFn, float]]) -> RewardFn:
    """Combine rewards: `weighted_sum([(jpeg_compressibility, 1.0), (shapes_faithfulness, 10.0)])`.

    The result is differentiable only when every term is. `.terms` keeps the parts so a trainer can log each.
    """
    items = list(terms.values()) if isinstance(terms, Mapping) else list(terms)
    if not items:
        raise ValueError("weighted_sum needs at least one (reward, weight) pair")

    def combined(images, prompts=None):
        total = None
        for reward, weight in items:
            value = weight * reward(images, prompts)
            total = value if total is None else total + value
        return total

    combined.differentiable = all(is_differentiable(reward) for reward, _ in items)
    combined.terms = items
    combined.__name__ = "+".join(f"{weight:g}*{getattr(reward, '__name__', 'reward')}" for reward, weight in items)
    return combined


BUILTIN_REWARDS: dict[str, RewardFn] = {
    "jpeg_compressibility": jpeg_compressibility,
    "jpeg_incompressibility": jpeg_incompressibility,
    "shapes_faithfulness": shapes_faithfulness,
    "shapes_exact": shapes_exact,
    "negative_total_variation": negative_total_variation,
    "brightness": brightness,
}


def get_reward(spec: str | RewardFn, **aesthetic_options) -> RewardFn:
    """A reward from a name or a weighted sum of names: "jpeg_compressibility", "shapes_faithfulness:2+brightness:1".

    "aesthetic" needs `clip_path=` (and optionally `head_path=`, `precision=`) in `aesthetic_options`.
    A callable passes through unchanged.
    """
    if callable(spec):
        return spec
    terms = []
    for part in spec.split("+"):
        name, _, weight_text = part.strip().partition(":")
        try:
            weight = float(weight_text) if weight_text else 1.0
        except ValueError:
            raise ValueError(f"reward term {part!r}: the weight after ':' must be a number") from None
        if name == "aesthetic":
            if not aesthetic_options.get("clip_path"):
                raise ValueError("the aesthetic reward needs the local path of a CLIP ViT-L/14 model "
                                 "(--clip_path DIR, HuggingFace transformers format); nothing is downloaded")
            reward = aesthetic(**aesthetic_options)
        elif name in BUILTIN_REWARDS:
            reward = BUILTIN_REWARDS[name]
        else:
            known = ", ".join(sorted([*BUILTIN_REWARDS, "aesthetic"]))
            raise ValueError(f"unknown reward {name!r}; choose from {known} (or a weighted sum like a:1+b:0.5)")
        terms.append((reward, weight))
    if len(terms) == 1 and terms[0][1] == 1.0:
        return terms[0][0]
    return weighted_sum(terms)


class RewardWorker:
    """Scores batches in a background thread so reward computation overlaps with sampling (as DDPO does).

    `future = worker.submit(images, prompts)` returns at once; `future.result()` gives the scores. Images are
    detached and moved to the CPU first so the sampler can keep using its own buffers. PIL's JPEG encoder and the
    checker release the GIL for much of their work, so one worker thread is enough to hide their cost.
    """

    def __init__(self, reward: RewardFn, max_workers: int = 1):
        self.reward = reward
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="reward")

    def submit(self, images, prompts: Sequence[str]) -> Future:
        images = images.detach().cpu() if hasattr(images, "detach") else images
        return self._executor.submit(self.reward, images, list(prompts))

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> "RewardWorker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
