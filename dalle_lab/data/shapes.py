"""The built-in Shapes dataset: a fixed caption grammar, a renderer and deterministic splits.

Grammar (other parts of the project and external evaluations depend on it exactly):

    one object:  "a {size} {color} {shape} {place} on a {background} background"
    two objects: "{a|an} {color1} {shape1} {relation} {a|an} {color2} {shape2} on a {background} background"

A caption is described by a `SceneSpec` (what the words say); a `Scene` adds the geometry (`Placement`s, in
fractions of the image side, y pointing down) that `render` draws. Items are pure functions of
(seed, split, index), so any worker or process can regenerate any item without shared state.

Splits are decided per caption, not per item, so they are stable and cheap to test:
- "heldout": every caption that contains one of `HELDOUT_PAIRS` (a colour-shape pair). Training never sees these
  pairs, although it sees each of their colours and shapes elsewhere: compositional generalisation.
- "val": about `VAL_FRACTION` of the remaining captions, chosen by a hash of the caption text.
- "train": the rest.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple, Sequence, Union

import numpy as np
import torch
from torch.utils.data import Dataset

DEFAULT_IMAGE_SIZE = 32

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 60, 220),
    "yellow": (240, 220, 30),
    "purple": (140, 40, 180),
    "orange": (250, 140, 20),
}
BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "white": (255, 255, 255),
    "black": (0, 0, 0),
    "gray": (128, 128, 128),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")

# Object side as a fraction of the image side. Jitter keeps "about" honest without making sizes ambiguous:
# the largest small object (0.24) and the smallest large one (0.39) stay far from each other.
SIZES: dict[str, float] = {"small": 0.22, "large": 0.42}
TWO_OBJECT_SIZE = 0.29
SIZE_JITTER = 0.08  # relative, uniform in [1 - j, 1 + j]

# Place names of the 3x3 grid, indexed by (row, column); the cell holding the object's centre names it.
PLACES: dict[str, tuple[int, int]] = {
    "at the top left": (0, 0),
    "at the top": (0, 1),
    "at the top right": (0, 2),
    "on the left": (1, 0),
    "in the center": (1, 1),
    "on the right": (1, 2),
    "at the bottom left": (2, 0),
    "at the bottom": (2, 1),
    "at the bottom right": (2, 2),
}
PLACE_BY_CELL: dict[tuple[int, int], str] = {cell: name for name, cell in PLACES.items()}
# Centres stay this far (fraction of the image side) inside their cell, so a blurred image still names one cell.
PLACE_MARGIN = 0.04

RELATIONS: tuple[str, ...] = ("above", "below", "left of", "right of")
# Two objects: centre distance along the relation's axis, and the largest offset across it. The minimum keeps a
# visible gap between the objects (0.38 - 0.31 >= 0.07 of the side), the cross offset keeps the axis unambiguous.
RELATION_DISTANCE = (0.38, 0.66)
RELATION_CROSS_OFFSET = 0.12

# Colour-shape pairs that only occur in the "heldout" split (each colour and shape still appears in training).
HELDOUT_PAIRS: frozenset[tuple[str, str]] = frozenset({("red", "triangle"), ("blue", "circle"), ("yellow", "square")})
VAL_FRACTION = 0.1
SPLITS: tuple[str, ...] = ("train", "val", "heldout")
_SPLIT_IDS = {name: number for number, name in enumerate(SPLITS)}


@dataclass(frozen=True)
class ObjectSpec:
    color: str
    shape: str


@dataclass(frozen=True)
class SceneSpec:
    """What a caption says. One object: `size` and `place` are set; two objects: `relation` is set."""

    objects: tuple[ObjectSpec, ...]
    background: str
    size: str | None = None
    place: str | None = None
    relation: str | None = None

    def __post_init__(self):
        _validate(self)


@dataclass(frozen=True)
class Placement:
    """Where an object is drawn: centre of its bounding box and its side, as fractions of the image side."""

    x: float
    y: float
    side: float


@dataclass(frozen=True)
class Scene:
    spec: SceneSpec
    placements: tuple[Placement, ...] = field(default=())


class ShapesItem(NamedTuple):
    image: torch.Tensor  # (3, H, W) float in [0, 1]
    caption: str
    scene: Scene


# ---------------------------------------------------------------------------------------------------------------
# Grammar: describe and parse


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _validate(spec: SceneSpec) -> None:
    def bad(what: str, value, allowed) -> ValueError:
        return ValueError(f"Shapes grammar: unknown {what} {value!r}; expected one of {sorted(allowed)}")

    if spec.background not in BACKGROUNDS:
        raise bad("background", spec.background, BACKGROUNDS)
    for obj in spec.objects:
        if obj.color not in PALETTE:
            raise bad("colour", obj.color, PALETTE)
        if obj.shape not in SHAPES:
            raise bad("shape", obj.shape, SHAPES)
    if len(spec.objects) == 1:
        if spec.size not in SIZES:
            raise bad("size", spec.size, SIZES)
        if spec.place not in PLACES:
            raise bad("place", spec.place, PLACES)
    elif len(spec.objects) == 2:
        if spec.relation not in RELATIONS:
            raise bad("relation", spec.relation, RELATIONS)
        if spec.objects[0].color == spec.objects[1].color:
            raise ValueError(f"Shapes grammar: the two objects must have different colours, got {spec.objects[0].color!r} twice")
    else:
        raise ValueError(f"Shapes grammar: a scene has one or two objects, got {len(spec.objects)}")


def describe(scene: Union[Scene, SceneSpec]) -> str:
    """The caption of a scene (or of a scene spec)."""
    spec = scene.spec if isinstance(scene, Scene) else scene
    if len(spec.objects) == 1:
        obj = spec.objects[0]
        return f"a {spec.size} {obj.color} {obj.shape} {spec.place} on a {spec.background} background"
    first, second = spec.objects
    return (
        f"{_article(first.color)} {first.color} {first.shape} {spec.relation} "
        f"{_article(second.color)} {second.color} {second.shape} on a {spec.background} background"
    )


def normalize_caption(caption: str) -> str:
    """Lower case, single spaces, no trailing full stop: the form `describe` writes."""
    return " ".join(caption.lower().strip().rstrip(".").split())


@lru_cache(maxsize=1)
def _caption_index() -> dict[str, SceneSpec]:
    return {describe(spec): spec for spec in all_scene_specs()}


def parse(caption: str) -> SceneSpec:
    """The SceneSpec of a caption in the Shapes grammar; ValueError naming the caption otherwise.

    Case, repeated spaces and a final full stop are ignored.
    """
    spec = _caption_index().get(normalize_caption(caption))
    if spec is None:
        raise ValueError(
            f"caption {caption!r} is not in the Shapes grammar; expected e.g. "
            f"'a small red circle at the top left on a white background' or "
            f"'a red circle above a blue square on a black background' (see docs/data.md)"
        )
    return spec


def is_shapes_caption(caption: str) -> bool:
    return normalize_caption(caption) in _caption_index()


@lru_cache(maxsize=1)
def all_scene_specs() -> tuple[SceneSpec, ...]:
    """Every caption's spec, in a fixed order: 972 one-object and 3240 two-object scenes."""
    specs = []
    for background in BACKGROUNDS:
        for color in PALETTE:
            for shape in SHAPES:
                for size in SIZES:
                    for place in PLACES:
                        specs.append(SceneSpec((ObjectSpec(color, shape),), background, size=size, place=place))
        for color1 in PALETTE:
            for shape1 in SHAPES:
                for color2 in PALETTE:
                    if color2 == color1:
                        continue
                    for shape2 in SHAPES:
                        for relation in RELATIONS:
                            objects = (ObjectSpec(color1, shape1), ObjectSpec(color2, shape2))
                            specs.append(SceneSpec(objects, background, relation=relation))
    return tuple(specs)


def all_captions(split: str | None = None) -> list[str]:
    """Every caption of the grammar (or of one split), in a fixed order."""
    return [describe(spec) for spec in all_scene_specs() if split is None or split_of(spec) == split]


def all_words() -> list[str]:
    """Every word the grammar uses, sorted: enough to build a text vocabulary."""
    words = {word for caption in all_captions() for word in caption.split()}
    return sorted(words)


# ---------------------------------------------------------------------------------------------------------------
# Splits


def split_of(caption_or_spec: Union[str, SceneSpec, Scene]) -> str:
    """"heldout", "val" or "train" for a caption (see the module docstring for the rule)."""
    if isinstance(caption_or_spec, str):
        spec = parse(caption_or_spec)
    elif isinstance(caption_or_spec, Scene):
        spec = caption_or_spec.spec
    else:
        spec = caption_or_spec
    if any((obj.color, obj.shape) in HELDOUT_PAIRS for obj in spec.objects):
        return "heldout"
    digest = hashlib.blake2b(describe(spec).encode(), digest_size=8).digest()
    return "val" if int.from_bytes(digest, "big") % 1000 < VAL_FRACTION * 1000 else "train"


@lru_cache(maxsize=None)
def _split_specs(split: str) -> tuple[tuple[SceneSpec, ...], tuple[SceneSpec, ...]]:
    """(one-object specs, two-object specs) of a split."""
    if split not in _SPLIT_IDS:
        raise ValueError(f"unknown Shapes split {split!r}; expected one of {SPLITS}")
    specs = [spec for spec in all_scene_specs() if split_of(spec) == split]
    return (
        tuple(spec for spec in specs if len(spec.objects) == 1),
        tuple(spec for spec in specs if len(spec.objects) == 2),
    )


# ---------------------------------------------------------------------------------------------------------------
# Wrong captions: one attribute changed (the --caption_noise training option)

# The attributes a caption states, by the names the checker reports (checker.judge), and the values each can take.
ATTRIBUTE_VALUES: dict[str, tuple[str, ...]] = {
    "color": tuple(PALETTE), "shape": SHAPES, "size": tuple(SIZES), "place": tuple(PLACES),
    "color1": tuple(PALETTE), "shape1": SHAPES, "relation": RELATIONS, "color2": tuple(PALETTE), "shape2": SHAPES,
    "background": tuple(BACKGROUNDS),
}


def spec_attributes(spec: SceneSpec) -> dict[str, str]:
    """The attributes a caption states: one object color, shape, size, place, background; two objects color1,
    shape1, relation, color2, shape2, background."""
    if len(spec.objects) == 1:
        obj = spec.objects[0]
        return {"color": obj.color, "shape": obj.shape, "size": spec.size, "place": spec.place,
                "background": spec.background}
    first, second = spec.objects
    return {"color1": first.color, "shape1": first.shape, "relation": spec.relation, "color2": second.color,
            "shape2": second.shape, "background": spec.background}


def _spec_from_attributes(a: dict[str, str]) -> SceneSpec:
    if "size" in a:
        return SceneSpec((ObjectSpec(a["color"], a["shape"]),), a["background"], size=a["size"], place=a["place"])
    objects = (ObjectSpec(a["color1"], a["shape1"]), ObjectSpec(a["color2"], a["shape2"]))
    return SceneSpec(objects, a["background"], relation=a["relation"])


@lru_cache(maxsize=None)
def _one_changed(spec: SceneSpec, split: str | None) -> tuple[tuple[SceneSpec, ...], ...]:
    """Per attribute of the spec (in spec_attributes' order), every valid spec with only that attribute changed,
    restricted to captions of `split` when given; attributes left without any alternative are dropped."""
    attributes = spec_attributes(spec)
    per_attribute = []
    for name, value in attributes.items():
        # the two objects of a scene keep different colours: the other object's colour is no alternative
        other_color = {"color1": attributes.get("color2"), "color2": attributes.get("color1")}.get(name)
        specs = tuple(_spec_from_attributes({**attributes, name: new}) for new in ATTRIBUTE_VALUES[name]
                      if new not in (value, other_color))
        specs = tuple(s for s in specs if split is None or split_of(s) == split)
        if specs:
            per_attribute.append(specs)
    return tuple(per_attribute)


def perturb_spec(spec: SceneSpec, rng: np.random.Generator, split: str | None = None) -> SceneSpec:
    """A valid spec with exactly one attribute of `spec` changed: the attribute uniformly among the scene's
    (spec_attributes), then its new value uniformly among the other valid values.

    `split` keeps the result a caption of that split: a training stream with wrong captions must still never show
    a held-out colour-shape pair or a validation caption. Attributes without an alternative in the split are
    skipped, and only that split's values are drawn from. All draws come from `rng`.
    """
    if split is not None and split not in _SPLIT_IDS:
        raise ValueError(f"unknown Shapes split {split!r}; expected one of {SPLITS}")
    choices = _one_changed(spec, split)
    if not choices:
        raise ValueError(f"no caption of split {split!r} differs from {describe(spec)!r} in exactly one attribute")
    specs = choices[int(rng.integers(len(choices)))]
    return specs[int(rng.integers(len(specs)))]


def perturb_caption(caption: str, rng: np.random.Generator, split: str | None = None) -> str:
    """The caption with exactly one attribute changed (see perturb_spec)."""
    return describe(perturb_spec(parse(caption), rng, split))


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


# ---------------------------------------------------------------------------------------------------------------
# The checker lives in checker.py (it needs scipy); these names keep `from dalle_lab.data.shapes import check` working.


def check(image, caption: str):
    """Check an image against a Shapes caption -> CheckResult(attributes, accuracy, exact). See checker.py."""
    from .checker import check as _check

    return _check(image, caption)


def evaluate(images, captions: Sequence[str]) -> dict:
    """Score a batch -> dict(accuracy, exact_match, per_attribute, n). See checker.py."""
    from .checker import evaluate as _evaluate

    return _evaluate(images, captions)
