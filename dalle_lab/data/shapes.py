"""The built-in Shapes dataset: scenes laid out and rendered from the caption grammar (shapes_grammar.py), and the
dataset whose items are pure functions of (seed, split, index), so any worker or process can regenerate any item
without shared state. The grammar's names are re-exported here: `from dalle_lab.data.shapes import parse` works.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from .shapes_grammar import (  # noqa: F401 (re-exported: the grammar is part of this module's interface)
    PALETTE,
    BACKGROUNDS,
    SHAPES,
    SIZES,
    TWO_OBJECT_SIZE,
    SIZE_JITTER,
    PLACES,
    PLACE_BY_CELL,
    PLACE_MARGIN,
    RELATIONS,
    RELATION_DISTANCE,
    RELATION_CROSS_OFFSET,
    HELDOUT_PAIRS,
    VAL_FRACTION,
    SPLITS,
    _SPLIT_IDS,
    ObjectSpec,
    SceneSpec,
    Placement,
    Scene,
    describe,
    normalize_caption,
    parse,
    is_shapes_caption,
    all_scene_specs,
    all_captions,
    all_words,
    split_of,
    _split_specs,
    ATTRIBUTE_VALUES,
    spec_attributes,
    perturb_spec,
    perturb_caption,
)

DEFAULT_IMAGE_SIZE = 32

__all__ = [  # the grammar's names, re-exported, and this module's
    "DEFAULT_IMAGE_SIZE", "ShapesDataset", "ShapesItem", "heldout_captions", "layout", "render", "sample_scene",
    "shape_alpha", "to_tensor", "validation_captions",
]


class ShapesItem(NamedTuple):
    image: torch.Tensor  # (3, H, W) float in [0, 1]
    caption: str
    scene: Scene


# ---------------------------------------------------------------------------------------------------------------
# Layout


def _jittered(side: float, rng: np.random.Generator) -> float:
    return side * rng.uniform(1 - SIZE_JITTER, 1 + SIZE_JITTER)


def layout(spec: SceneSpec, rng: np.random.Generator) -> Scene:
    """Random geometry that matches the spec (place cell, relation axis), objects fully inside the image."""
    if len(spec.objects) == 1:
        side = _jittered(SIZES[spec.size], rng)
        row, col = PLACES[spec.place]

        def coordinate(cell: int) -> float:
            low = max(cell / 3 + PLACE_MARGIN, side / 2)
            high = min((cell + 1) / 3 - PLACE_MARGIN, 1 - side / 2)
            return rng.uniform(low, high)

        return Scene(spec, (Placement(coordinate(col), coordinate(row), side),))

    sides = [_jittered(TWO_OBJECT_SIZE, rng) for _ in range(2)]
    distance = rng.uniform(*RELATION_DISTANCE)
    cross = rng.uniform(-RELATION_CROSS_OFFSET, RELATION_CROSS_OFFSET)
    # Offset of object 1's centre from object 2's, (along, across) the relation axis.
    sign = -1.0 if spec.relation in ("above", "left of") else 1.0
    along, across = sign * distance, cross
    if spec.relation in ("above", "below"):
        dx, dy = across, along
    else:
        dx, dy = along, across

    def centre_pair(delta: float) -> tuple[float, float]:
        # Choose object 2's coordinate so both objects fit: c2 and c2 + delta in [half_i, 1 - half_i].
        low = max(sides[1] / 2, sides[0] / 2 - delta)
        high = min(1 - sides[1] / 2, 1 - sides[0] / 2 - delta)
        c2 = rng.uniform(low, high)
        return c2 + delta, c2

    x1, x2 = centre_pair(dx)
    y1, y2 = centre_pair(dy)
    return Scene(spec, (Placement(x1, y1, sides[0]), Placement(x2, y2, sides[1])))


# ---------------------------------------------------------------------------------------------------------------
# Rendering


def _supersampling(image_size: int) -> int:
    # Draw at 4x and average down for clean anti-aliased edges; fewer subsamples where pixels are already small.
    return 4 if image_size <= 128 else 2


def shape_alpha(shape: str, x: float, y: float, side: float, image_size: int) -> tuple[np.ndarray, slice, slice]:
    """Anti-aliased coverage (0..1) of one shape, computed only over its bounding box.

    Returns (alpha, rows, cols): alpha has the shape of image[rows, cols]. Coordinates are fractions of the
    image side; the triangle is upright with base = height = side. Used by the renderer and by the checker's
    templates, so both agree on what each shape looks like.
    """
    ss = _supersampling(image_size)
    half = side / 2
    r0 = max(0, int(np.floor((y - half) * image_size)))
    r1 = min(image_size, int(np.ceil((y + half) * image_size)))
    c0 = max(0, int(np.floor((x - half) * image_size)))
    c1 = min(image_size, int(np.ceil((x + half) * image_size)))
    if r1 <= r0 or c1 <= c0:
        return np.zeros((0, 0), np.float32), slice(r0, r0), slice(c0, c0)
    fine = image_size * ss
    ys = ((np.arange(r0 * ss, r1 * ss) + 0.5) / fine - y)[:, None]
    xs = ((np.arange(c0 * ss, c1 * ss) + 0.5) / fine - x)[None, :]
    if shape == "square":
        mask = (np.abs(ys) <= half) & (np.abs(xs) <= half)
    elif shape == "circle":
        mask = ys**2 + xs**2 <= half**2
    elif shape == "triangle":
        depth = ys + half  # distance below the apex; the width there equals the depth
        mask = (depth >= 0) & (depth <= side) & (np.abs(xs) <= depth / 2)
    else:
        raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")
    alpha = mask.reshape(r1 - r0, ss, c1 - c0, ss).mean(axis=(1, 3), dtype=np.float32)
    return alpha, slice(r0, r1), slice(c0, c1)


def render(scene: Scene, image_size: int = DEFAULT_IMAGE_SIZE) -> np.ndarray:
    """Draw a scene: (H, W, 3) uint8, flat colours with anti-aliased edges."""
    image = np.empty((image_size, image_size, 3), np.float32)
    image[:] = BACKGROUNDS[scene.spec.background]
    for obj, place in zip(scene.spec.objects, scene.placements):
        alpha, rows, cols = shape_alpha(obj.shape, place.x, place.y, place.side, image_size)
        region = image[rows, cols]
        region += alpha[..., None] * (np.asarray(PALETTE[obj.color], np.float32) - region)
    return np.rint(image).astype(np.uint8)


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """(..., H, W, 3) uint8 -> (..., 3, H, W) float in [0, 1].

    Converted in numpy: torch's strided copy of a permuted uint8 tensor is several times slower here.
    """
    channels_first = np.ascontiguousarray(np.moveaxis(images, -1, -3), dtype=np.float32)
    channels_first /= 255
    return torch.from_numpy(channels_first)


# ---------------------------------------------------------------------------------------------------------------
# The dataset


def sample_scene(split: str, index: int, seed: int = 0) -> Scene:
    """The scene of item `index` of a split: half one-object, half two-object captions, uniform within each."""
    one, two = _split_specs(split)
    rng = np.random.default_rng((seed, _SPLIT_IDS[split], index))
    pool = one if rng.random() < 0.5 else two
    spec = pool[int(rng.integers(len(pool)))]
    return layout(spec, rng)


class ShapesDataset(Dataset):
    """Deterministic Shapes items: `dataset[i] -> (image (3,H,W) float in [0,1], caption)`.

    Item i depends only on (seed, split, i); images are rendered on access (about 0.1 ms at 32 px), so the
    dataset is as long as you like and costs no memory.
    """

    def __init__(self, split: str = "train", length: int = 10_000, image_size: int = DEFAULT_IMAGE_SIZE, seed: int = 0):
        if split not in _SPLIT_IDS:
            raise ValueError(f"unknown Shapes split {split!r}; expected one of {SPLITS}")
        if length < 1:
            raise ValueError(f"ShapesDataset length must be positive, got {length}")
        if image_size < 8:
            raise ValueError(f"ShapesDataset image_size must be at least 8 pixels, got {image_size}")
        if seed < 0:
            raise ValueError(f"ShapesDataset seed must be a non-negative integer, got {seed}")
        self.split, self.length, self.image_size, self.seed = split, int(length), int(image_size), int(seed)

    def __len__(self) -> int:
        return self.length

    def _check_index(self, index: int) -> int:
        index = int(index)  # numpy and torch integers too
        if index < 0:
            index += self.length
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for a ShapesDataset of length {self.length}")
        return index

    def scene(self, index: int) -> Scene:
        return sample_scene(self.split, self._check_index(index), self.seed)

    def caption(self, index: int) -> str:
        return describe(self.scene(index))

    def item(self, index: int) -> ShapesItem:
        scene = self.scene(index)
        return ShapesItem(to_tensor(render(scene, self.image_size)), describe(scene), scene)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, str]:
        scene = self.scene(index)
        return to_tensor(render(scene, self.image_size)), describe(scene)

    def batch(self, indices: Sequence[int]) -> tuple[torch.Tensor, list[str]]:
        """Images (B, 3, H, W) and captions for some indices, without a DataLoader."""
        scenes = [self.scene(i) for i in indices]
        images = np.stack([render(scene, self.image_size) for scene in scenes])
        return to_tensor(images), [describe(s) for s in scenes]


def validation_captions(n: int, seed: int = 0) -> list[str]:
    """Captions of the first n items of ShapesDataset("val", seed=seed): never seen in training."""
    return [describe(sample_scene("val", i, seed)) for i in range(n)]


def heldout_captions(n: int, seed: int = 0) -> list[str]:
    """Captions of the first n items of ShapesDataset("heldout", seed=seed): held-out colour-shape pairs."""
    return [describe(sample_scene("heldout", i, seed)) for i in range(n)]
