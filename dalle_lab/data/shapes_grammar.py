"""The Shapes caption grammar: what a caption can say, its words, its splits, and captions with one attribute changed.

Grammar (other parts of the project and external evaluations depend on it exactly):

    one object:  "a {size} {color} {shape} {place} on a {background} background"
    two objects: "{a|an} {color1} {shape1} {relation} {a|an} {color2} {shape2} on a {background} background"

A caption is described by a `SceneSpec` (what the words say); a `Scene` adds the geometry (`Placement`s, in
fractions of the image side, y pointing down) that shapes.render draws. No pixels here: shapes.py lays scenes out,
renders them and serves the dataset.

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
from typing import Union

import numpy as np

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
