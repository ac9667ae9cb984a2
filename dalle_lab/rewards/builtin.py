"""The built-in rewards: plain functions `reward(images, prompts) -> scores` (images (B, 3, H, W) in [0, 1]).

Score-only rewards (JPEG size, the Shapes checker) feed policy gradient; the differentiable ones
(`reward.differentiable = True`, torch ops only) can also drive reward backpropagation.
"""
from __future__ import annotations

import io
from typing import Callable, Sequence

import numpy as np

from dalle_lab.stats import groups_of

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
    from dalle_lab.data.checker import check

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


MAX_ATTRIBUTES = 6  # a two-object caption states six attributes, a one-object caption five


def _grid(num_tokens: int) -> int:
    grid = int(round(num_tokens ** 0.5))
    if grid * grid != num_tokens:
        raise ValueError(f"Shapes credit maps need a square token grid, got {num_tokens} image tokens")
    return grid


def _shapes_credit(images, prompts, num_tokens: int, exact: bool):
    """Credited scores of the checker (dalle_lab.rewards.credit): faithfulness is the mean of the attributes, so
    each attribute is a part (its verdict / their number) credited to the cells that decided it
    (checker.attribute_cells); exact match is one part credited to the cells of the attributes it failed on, or of
    all of them when it holds."""
    import torch

    from dalle_lab.data.checker import attribute_cells
    from dalle_lab.rewards.credit import CreditedScores

    grid = _grid(num_tokens)
    results = _shapes_results(images, prompts)
    k = 1 if exact else MAX_ATTRIBUTES
    parts, maps = torch.zeros(len(results), k), torch.zeros(len(results), k, num_tokens)
    for i, (result, caption) in enumerate(zip(results, prompts)):
        cells = attribute_cells(result, caption, grid)
        if exact:
            failed = [cells[name] for name, ok in result.attributes.items() if not ok] or list(cells.values())
            parts[i, 0] = float(result.exact)
            maps[i, 0] = torch.from_numpy(np.logical_or.reduce(failed).reshape(-1))
            continue
        for j, (name, ok) in enumerate(result.attributes.items()):
            parts[i, j] = float(ok) / len(result.attributes)
            maps[i, j] = torch.from_numpy(cells[name].reshape(-1))
    return CreditedScores(parts.sum(1), parts, maps)


shapes_faithfulness.credit = lambda images, prompts, num_tokens: _shapes_credit(images, prompts, num_tokens, False)
shapes_exact.credit = lambda images, prompts, num_tokens: _shapes_credit(images, prompts, num_tokens, True)


def group_diversity(images, prompts: Sequence[str]):
    """Each image's mean absolute pixel difference (in [0, 1]) to the other images of the same caption in the batch;
    0 for an image whose caption it shares with no other.

    As a term of a reward (`--reward shapes_faithfulness+group_diversity:2`) it makes sharpening towards one layout
    per caption cost reward, but it pays every sample for differing, errors included: on the Shapes model it raised
    stray objects by 38 % (docs/align.md). The policy gradient's own diversity bonus (dalle_lab.align.diversity_bonus,
    on by default) gives it to each group's best samples only. Scores depend on the batch: the trainer scores whole
    groups together when sample_batch_size is a multiple of group_size.
    """
    import torch

    if prompts is None or len(prompts) != len(images):
        raise ValueError("group_diversity needs one caption per image (got "
                         f"{None if prompts is None else len(prompts)} captions for {len(images)} images)")
    flat = torch.as_tensor(images).detach().float().flatten(1)
    scores = torch.zeros(len(flat), device=flat.device)
    for members in groups_of(prompts):
        if len(members) > 1:
            scores[members] = mean_distance_to_others(flat[members])
    return scores


def mean_distance_to_others(rows):
    """(n, D) -> (n,): each row's mean absolute difference to the other rows, averaged over the n - 1 of them."""
    import torch

    distance = torch.cdist(rows[None], rows[None], p=1)[0] / rows.shape[1]  # (n, n), zero diagonal
    return distance.sum(1) / (len(rows) - 1)


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
