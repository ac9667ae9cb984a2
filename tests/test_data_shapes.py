"""The Shapes grammar, renderer, determinism and splits."""
import numpy as np
import pytest
import torch

from dalle_lab.data import shapes
from dalle_lab.data.shapes import (
    PALETTE,
    BACKGROUNDS,
    ShapesDataset,
    all_captions,
    all_scene_specs,
    all_words,
    describe,
    heldout_captions,
    parse,
    render,
    split_of,
    validation_captions,
)


def test_every_caption_round_trips_through_parse():
    specs = all_scene_specs()
    assert len(specs) == 2 * 6 * 3 * 9 * 3 + 6 * 3 * 5 * 3 * 4 * 3
    assert len({describe(spec) for spec in specs}) == len(specs)
    for spec in specs:
        assert parse(describe(spec)) == spec


def test_caption_forms_follow_the_grammar():
    assert parse("A small red circle at the top left on a white background.").place == "at the top left"
    two = parse("an orange square left of a blue triangle on a gray background")
    assert [(o.color, o.shape) for o in two.objects] == [("orange", "square"), ("blue", "triangle")]
    assert two.relation == "left of"
    assert describe(two) == "an orange square left of a blue triangle on a gray background"
    for bad in ["a red circle", "a huge red circle in the center on a white background",
                "a red square above a red circle on a white background",  # same colour twice
                "a orange square above a red circle on a black background"]:  # wrong article
        with pytest.raises(ValueError, match="Shapes grammar|not in the Shapes grammar"):
            parse(bad)


def test_all_words_cover_every_caption():
    words = set(all_words())
    assert {"orange", "triangle", "left", "background", "an"} <= words
    assert all(set(caption.split()) <= words for caption in all_captions())


def test_items_are_deterministic_and_depend_on_seed_and_split():
    a, b = ShapesDataset("train", 50, seed=3), ShapesDataset("train", 50, seed=3)
    for i in (0, 7, 49):
        image_a, caption_a = a[i]
        image_b, caption_b = b[i]
        assert caption_a == caption_b and torch.equal(image_a, image_b)
    other_seed = ShapesDataset("train", 50, seed=4)
    assert [a.caption(i) for i in range(20)] != [other_seed.caption(i) for i in range(20)]
    assert a.caption(-1) == a.caption(49)
    with pytest.raises(IndexError):
        a[50]


def test_item_image_format_and_scene():
    dataset = ShapesDataset("val", 8, image_size=32)
    item = dataset.item(0)
    assert item.image.shape == (3, 32, 32) and item.image.dtype == torch.float32
    assert 0 <= float(item.image.min()) and float(item.image.max()) <= 1
    assert describe(item.scene) == item.caption
    images, captions = dataset.batch([0, 1, 2])
    assert images.shape == (3, 3, 32, 32) and captions[0] == item.caption
    assert torch.equal(images[0], item.image)
    assert ShapesDataset("train", 4, image_size=48)[0][0].shape == (3, 48, 48)


def test_render_draws_the_scene_colours_in_their_place():
    spec = parse("a large green square in the center on a black background")
    scene = shapes.Scene(spec, (shapes.Placement(0.5, 0.5, 0.42),))
    image = render(scene, 32)
    assert tuple(image[16, 16]) == PALETTE["green"]
    assert tuple(image[1, 1]) == BACKGROUNDS["black"]
    # A triangle is upright: wide at the bottom, a point at the top.
    spec = parse("a large red triangle in the center on a white background")
    tri = render(shapes.Scene(spec, (shapes.Placement(0.5, 0.5, 0.42),)), 64)
    red = np.all(tri == PALETTE["red"], axis=-1)
    rows = np.nonzero(red.any(axis=1))[0]
    assert red[rows[-1]].sum() > 4 * red[rows[0]].sum()


def test_layout_matches_the_caption():
    dataset = ShapesDataset("train", 300)
    for i in range(300):
        scene = dataset.scene(i)
        for place in scene.placements:  # fully inside the image
            assert place.side / 2 <= place.x <= 1 - place.side / 2 + 1e-9
            assert place.side / 2 <= place.y <= 1 - place.side / 2 + 1e-9
        spec = scene.spec
        if len(spec.objects) == 1:
            row, col = shapes.PLACES[spec.place]
            place = scene.placements[0]
            assert (int(place.y * 3), int(place.x * 3)) == (row, col)
            assert abs(place.side - shapes.SIZES[spec.size]) <= 0.1 * shapes.SIZES[spec.size]
        else:
            first, second = scene.placements
            dx, dy = first.x - second.x, first.y - second.y
            expected = ("above" if dy < 0 else "below") if abs(dy) > abs(dx) else ("left of" if dx < 0 else "right of")
            assert spec.relation == expected
            assert max(abs(dx), abs(dy)) > (first.side + second.side) / 2  # no overlap


def test_splits_are_disjoint_and_heldout_pairs_never_train():
    train, val, heldout = (set(all_captions(split)) for split in ("train", "val", "heldout"))
    assert train and val and heldout
    assert not (train & val) and not (train & heldout) and not (val & heldout)
    assert len(train | val | heldout) == len(all_scene_specs())
    pairs = [f"{color} {shape}" for color, shape in shapes.HELDOUT_PAIRS]
    assert not any(pair in caption for caption in train | val for pair in pairs)
    # Each held-out colour and shape still appears in training.
    for color, shape in shapes.HELDOUT_PAIRS:
        assert any(color in c for c in train) and any(shape in c for c in train)
    # Sampled items respect the split.
    assert all(split_of(c) == "val" for c in validation_captions(100))
    assert all(split_of(c) == "heldout" for c in heldout_captions(100))
    assert all(split_of(ShapesDataset("train", 200).caption(i)) == "train" for i in range(200))
    assert validation_captions(20, seed=1) == [ShapesDataset("val", 20, seed=1).caption(i) for i in range(20)]


def test_sampling_mixes_one_and_two_object_captions():
    dataset = ShapesDataset("train", 400)
    ones = sum(len(dataset.scene(i).spec.objects) == 1 for i in range(400))
    assert 120 < ones < 280


def test_builtin_dataset_selects_shapes_by_name():
    from dalle_lab.data.builtin import builtin_dataset

    dataset = builtin_dataset("shapes", "val", image_size=16, length=5, seed=2)
    assert isinstance(dataset, ShapesDataset) and len(dataset) == 5 and dataset[0][0].shape == (3, 16, 16)
    with pytest.raises(ValueError, match="unknown built-in dataset"):
        builtin_dataset("mnist")
