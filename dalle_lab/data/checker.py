"""The Shapes checker: does an image show what its caption (in the Shapes grammar) says?

It reads the image the way the renderer drew it, so it stays right on images a lossy image tokenizer degraded:

1. Background: the median colour of the border pixels, named by the nearest background colour.
2. Colour unmixing: every pixel is explained as `background + alpha * (colour - background)` for each palette
   colour; the colour with the smallest residual wins and alpha is its coverage. Anti-aliased or blurred edges
   are such blends, so edges keep their object's colour instead of looking like a third colour
   (red blurred into white is pink, which is nearer to orange than to red by plain distance).
3. Objects: connected components of pixels at least half covered by one colour, large enough to be an object.
4. Geometry from the coverage map: area = sum of alpha and centre = alpha-weighted centroid (both unchanged by
   blur); the shape is the template (drawn by the renderer at that area and centre) closest to the coverage.

Attributes (all booleans; `accuracy` is their mean, `exact` is all of them):
    one object:  color, shape, size, place, background       judged on the largest object found
    two objects: color1, shape1, color2, shape2, relation, background
        caption object k is the largest object of its colour; when that colour is missing, colork is False and
        shapek is judged on the largest object not yet matched, so a wrong colour does not also fail the shape.
Extra objects are not penalised.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from .shapes import shape_alpha
from .shapes_grammar import BACKGROUNDS, PALETTE, PLACE_BY_CELL, SHAPES, SIZES, SceneSpec, parse

_COLOR_NAMES = tuple(PALETTE)
_PALETTE_RGB = np.array([PALETTE[name] for name in _COLOR_NAMES], np.float32)
_BACKGROUND_NAMES = tuple(BACKGROUNDS)
_BACKGROUND_RGB = np.array([BACKGROUNDS[name] for name in _BACKGROUND_NAMES], np.float32)

# Area of each shape relative to its bounding square (the triangle's base and height equal its side).
_FILL = {"square": 1.0, "circle": math.pi / 4, "triangle": 0.5}
# Between the small (0.22) and the large (0.42) side.
SIZE_THRESHOLD = (SIZES["small"] + SIZES["large"]) / 2
# Pixels count towards an object when at least this much of them is its colour.
_COVERAGE_THRESHOLD = 0.5
# An object must cover at least this fraction of the smallest drawn object's area (a small triangle), so noise
# specks and thin edge fringes are not objects.
_MIN_OBJECT_FRACTION = 0.25
_SMALLEST_OBJECT_AREA = 0.5 * (SIZES["small"] * 0.9) ** 2
# The image's blur is unknown (a tokenizer's decoder, resampling), so each template is compared at several blurs,
# in pixels of a 32-px image (scaled with the image side), and the best blur counts.
_TEMPLATE_BLURS = (0.0, 0.5, 0.8, 1.1, 1.5, 2.0)


@dataclass
class DetectedObject:
    color: str
    shape: str
    x: float  # centre of the bounding box, fraction of the width
    y: float  # fraction of the height, 0 at the top
    side: float  # side of the bounding box, fraction of the image side
    area: float  # covered pixels (sum of alpha)

    @property
    def place(self) -> str:
        return PLACE_BY_CELL[(min(int(self.y * 3), 2), min(int(self.x * 3), 2))]

    @property
    def size(self) -> str:
        return "small" if self.side < SIZE_THRESHOLD else "large"


@dataclass
class Analysis:
    background: str
    objects: list[DetectedObject]  # largest first


@dataclass
class CheckResult:
    attributes: dict[str, bool]
    accuracy: float
    exact: bool
    analysis: Analysis | None = field(default=None, repr=False)


# ---------------------------------------------------------------------------------------------------------------
# Image analysis


def as_rgb_array(image) -> np.ndarray:
    """(H, W, 3) float32 in 0..255 from a (3,H,W) float tensor/array in [0,1], an (H,W,3) uint8 array or a PIL image."""
    if hasattr(image, "convert") and hasattr(image, "size"):  # PIL image
        return np.asarray(image.convert("RGB"), np.float32)
    if hasattr(image, "detach"):  # torch tensor
        image = image.detach().cpu().float().numpy()
    array = np.asarray(image)
    if array.ndim != 3:
        raise ValueError(f"expected one image of shape (3, H, W) or (H, W, 3), got shape {array.shape}")
    if array.shape[0] == 3 and array.shape[-1] != 3:
        array = array.transpose(1, 2, 0)
    if array.shape[-1] != 3:
        raise ValueError(f"expected an RGB image of shape (3, H, W) or (H, W, 3), got shape {array.shape}")
    if array.dtype == np.uint8:
        return array.astype(np.float32)
    # Floats are taken to be in [0, 1] (the dataset's convention).
    return np.clip(array.astype(np.float32), 0.0, 1.0) * 255.0


def _border_pixels(rgb: np.ndarray) -> np.ndarray:
    return np.concatenate([rgb[0], rgb[-1], rgb[1:-1, 0], rgb[1:-1, -1]])


def _unmix(rgb: np.ndarray, background_rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pixel: the best palette colour index, its coverage alpha (unclipped) and the coverage of every colour.

    Returns (labels (H,W), alpha (H,W), alphas (H,W,C)) with alpha in units of "fraction of the colour".
    """
    offset = rgb - background_rgb  # (H, W, 3)
    directions = _PALETTE_RGB - background_rgb  # (C, 3)
    norms = np.maximum((directions**2).sum(-1), 1.0)  # a palette colour equal to the background has no direction
    projections = offset @ directions.T  # (H, W, C)
    alphas = projections / norms
    clipped = np.clip(alphas, 0.0, 1.0)
    # |offset - a d|^2 expanded, so no (H, W, C, 3) array is built.
    residual = (offset**2).sum(-1, keepdims=True) - 2 * clipped * projections + clipped**2 * norms
    labels = residual.argmin(-1)
    alpha = np.take_along_axis(alphas, labels[..., None], -1)[..., 0]
    return labels, alpha, alphas


def _template(shape: str, x: float, y: float, side: float, size: int) -> np.ndarray:
    canvas = np.zeros((size, size), np.float32)
    alpha, rows, cols = shape_alpha(shape, x, y, side, size)
    canvas[rows, cols] = alpha
    return canvas


def _fit_shape(coverage: np.ndarray, window: tuple[slice, slice], size: int) -> DetectedObject | None:
    """Shape, side and centre of one object from its coverage map, looking only inside `window`."""
    from scipy.ndimage import gaussian_filter

    coverage = coverage[window]
    area = float(coverage.sum())
    if area <= 0:
        return None
    rows, cols = window
    cx = float((coverage.sum(0) * (np.arange(cols.start, cols.stop) + 0.5)).sum() / area) / size
    cy = float((coverage.sum(1) * (np.arange(rows.start, rows.stop) + 0.5)).sum() / area) / size
    best = None
    for shape in SHAPES:
        side = math.sqrt(area / _FILL[shape]) / size
        # The centroid of an upright triangle lies side/6 below its bounding box centre.
        y = cy - side / 6 if shape == "triangle" else cy
        template = _template(shape, cx, y, side, size)[window]
        for blur in _TEMPLATE_BLURS:
            blurred = gaussian_filter(template, blur * size / 32) if blur else template
            error = float(((coverage - blurred) ** 2).sum())
            if best is None or error < best[0]:
                best = (error, DetectedObject("", shape, cx, y, side, area))
    return best[1]


def _window(mask: np.ndarray, pad: int) -> tuple[slice, slice]:
    rows, cols = np.nonzero(mask)
    size = mask.shape[0]
    return (slice(max(0, rows.min() - pad), min(size, rows.max() + pad + 1)),
            slice(max(0, cols.min() - pad), min(size, cols.max() + pad + 1)))


def analyse(image) -> Analysis:
    """Find the background and the objects of an image (any input `as_rgb_array` takes)."""
    from scipy import ndimage

    rgb = as_rgb_array(image)
    height, width, _ = rgb.shape
    if height != width:
        raise ValueError(f"the Shapes checker expects square images, got {height}x{width}")
    size = height
    background_rgb = np.median(_border_pixels(rgb), axis=0)
    background = _BACKGROUND_NAMES[int(((_BACKGROUND_RGB - background_rgb) ** 2).sum(-1).argmin())]

    labels, alpha, alphas = _unmix(rgb, background_rgb)
    covered = alpha >= _COVERAGE_THRESHOLD
    min_pixels = max(2.0, _MIN_OBJECT_FRACTION * _SMALLEST_OBJECT_AREA * size * size)
    candidates = []  # (pixels, colour index, component mask)
    for index in range(len(_COLOR_NAMES)):
        components, count = ndimage.label(covered & (labels == index))
        if count == 0:
            continue
        pixel_counts = np.bincount(components.ravel(), minlength=count + 1)
        for component in np.nonzero(pixel_counts[1:] >= min_pixels)[0] + 1:
            candidates.append((int(pixel_counts[component]), index, components == component))

    all_objects = np.zeros((size, size), bool)
    for _, _, mask in candidates:
        all_objects |= mask
    edge_width = max(2, round(2 * size / 32))
    objects = []
    for _, index, mask in candidates:
        # The object's neighbourhood (its soft edges, wider in larger images), minus the other objects' pixels.
        neighbourhood = ndimage.binary_dilation(mask, iterations=edge_width) & ~(all_objects & ~mask)
        # Clip to [-0.5, 1.5] rather than [0, 1] so background noise averages out instead of adding area.
        coverage = np.where(neighbourhood, np.clip(alphas[..., index], -0.5, 1.5), 0.0)
        # Room for a template misplaced by the shape guess and for the widest blur.
        pad = 2 + math.ceil(3 * max(_TEMPLATE_BLURS) * size / 32) + int(mask.sum() ** 0.5) // 2
        found = _fit_shape(coverage, _window(mask, pad), size)
        if found is not None:
            found.color = _COLOR_NAMES[index]
            objects.append(found)
    objects.sort(key=lambda obj: obj.area, reverse=True)
    return Analysis(background, objects)


# ---------------------------------------------------------------------------------------------------------------
# Verdicts


def _relation(first: DetectedObject, second: DetectedObject) -> str:
    dx, dy = first.x - second.x, first.y - second.y
    if abs(dy) >= abs(dx):
        return "above" if dy < 0 else "below"
    return "left of" if dx < 0 else "right of"


def matched_objects(analysis: Analysis, spec: SceneSpec) -> list[DetectedObject | None]:
    """The detected object each caption object is judged on (None: nothing left to judge), in the caption's order.

    One object: the largest object found. Two objects: caption object k is the largest object of its colour; when
    that colour is missing, the largest object not yet matched stands in, so a wrong colour does not also fail the
    shape."""
    if len(spec.objects) == 1:
        return [analysis.objects[0] if analysis.objects else None]
    remaining = list(analysis.objects)
    matched: list[DetectedObject | None] = [None, None]
    for k, wanted in enumerate(spec.objects):
        for obj in remaining:
            if obj.color == wanted.color:
                matched[k] = obj
                remaining.remove(obj)
                break
    for k in range(2):
        if matched[k] is None and remaining:
            matched[k] = remaining.pop(0)
    return matched


def judge(analysis: Analysis, spec: SceneSpec) -> dict[str, bool]:
    """Per-attribute verdicts of an analysed image against a caption's spec (attribute names: module docstring)."""
    attributes: dict[str, bool] = {}
    matched = matched_objects(analysis, spec)
    if len(spec.objects) == 1:
        found = matched[0]
        attributes["color"] = found is not None and found.color == spec.objects[0].color
        attributes["shape"] = found is not None and found.shape == spec.objects[0].shape
        attributes["size"] = found is not None and found.size == spec.size
        attributes["place"] = found is not None and found.place == spec.place
    else:
        for k, wanted in enumerate(spec.objects, start=1):
            obj = matched[k - 1]
            attributes[f"color{k}"] = obj is not None and obj.color == wanted.color
            attributes[f"shape{k}"] = obj is not None and obj.shape == wanted.shape
        attributes["relation"] = None not in matched and _relation(matched[0], matched[1]) == spec.relation
    attributes["background"] = analysis.background == spec.background
    return attributes


def _object_cells(obj: DetectedObject, grid: int, border: int) -> np.ndarray:
    """(grid, grid) bool: the token cells the object's bounding box touches, grown by `border` cells."""
    cells = np.zeros((grid, grid), bool)
    half = obj.side / 2

    def span(centre: float) -> slice:
        low = math.floor((centre - half) * grid) - border
        high = math.ceil((centre + half) * grid) + border
        return slice(max(low, 0), min(max(high, 1), grid))

    cells[span(obj.y), span(obj.x)] = True
    return cells


def attribute_cells(result: CheckResult, caption: str, grid: int) -> dict[str, np.ndarray]:
    """For each attribute of `result` (a `check` of this caption), the (grid, grid) bool map of the image-token cells
    that decided it: colour, shape and size the cells of the object judged (plus a one-cell border, where edges and
    anti-aliasing live); place and relation the cells of the object(s) judged; background the cells outside every
    object found. A verdict on an object that is not there (nothing drawn where the caption wants something) has
    no place to point at: every cell. Used as the credit maps of the Shapes rewards (dalle_lab.rewards.credit)."""
    spec = parse(caption)
    matched = matched_objects(result.analysis, spec)
    everywhere = np.ones((grid, grid), bool)

    def cells(objects, border):
        if any(obj is None for obj in objects):
            return everywhere
        return np.logical_or.reduce([_object_cells(obj, grid, border) for obj in objects])

    outside = ~np.logical_or.reduce([_object_cells(obj, grid, 0) for obj in result.analysis.objects] +
                                    [np.zeros((grid, grid), bool)])
    maps = {}
    for name in result.attributes:
        if name == "background":
            maps[name] = outside
        elif name == "relation":
            maps[name] = cells(matched, 0)
        elif name == "place":
            maps[name] = cells(matched[:1], 0)
        else:  # color, shape, size (one object); color1/shape1, color2/shape2 (two objects)
            index = int(name[-1]) - 1 if name[-1].isdigit() else 0
            maps[name] = cells(matched[index:index + 1], 1)
    return maps


def check(image, caption: str) -> CheckResult:
    """Check an image against a Shapes caption: per-attribute verdicts, their mean (`accuracy`) and `exact`.

    `image`: a (3,H,W) float tensor in [0,1], an (H,W,3) uint8 array or a PIL image, square, any side >= 16 px.
    Raises ValueError for a caption outside the Shapes grammar.
    """
    spec = parse(caption)
    analysis = analyse(image)
    attributes = judge(analysis, spec)
    accuracy = sum(attributes.values()) / len(attributes)
    return CheckResult(attributes, accuracy, all(attributes.values()), analysis)


def evaluate(images: Iterable, captions: Sequence[str]) -> dict:
    """Score a batch: dict(accuracy, exact_match, per_attribute={name: mean}, n).

    `images`: a (B,3,H,W) tensor or any iterable of images `check` accepts, one per caption.
    """
    images = list(images)
    if len(images) != len(captions):
        raise ValueError(f"evaluate needs one caption per image, got {len(images)} images and {len(captions)} captions")
    if not images:
        raise ValueError("evaluate needs at least one image")
    results = [check(image, caption) for image, caption in zip(images, captions)]
    per_attribute: dict[str, list[bool]] = {}
    for result in results:
        for name, ok in result.attributes.items():
            per_attribute.setdefault(name, []).append(ok)
    return {
        "accuracy": float(np.mean([result.accuracy for result in results])),
        "exact_match": float(np.mean([result.exact for result in results])),
        "per_attribute": {name: float(np.mean(values)) for name, values in per_attribute.items()},
        "n": len(results),
    }
