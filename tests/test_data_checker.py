"""The Shapes checker: right verdicts on rendered images, wrong ones on images that differ from the caption."""
import numpy as np
import pytest
from PIL import Image
from scipy.ndimage import gaussian_filter

from dalle_lab.data.checker import analyse, check, evaluate
from dalle_lab.data.shapes import Placement, Scene, ShapesDataset, parse, render, to_tensor


def draw(caption, *placements, size=32):
    return render(Scene(parse(caption), tuple(Placement(*p) for p in placements)), size)


ONE = "a small red circle at the top left on a white background"
ONE_AT = (0.17, 0.17, 0.22)
TWO = "an orange square above a blue triangle on a gray background"
TWO_AT = ((0.5, 0.25, 0.29), (0.55, 0.72, 0.29))


def test_rendered_items_pass_every_attribute():
    dataset = ShapesDataset("val", 40)
    for i in range(40):
        item = dataset.item(i)
        result = check(item.image, item.caption)
        assert result.exact and result.accuracy == 1.0, (item.caption, result.attributes)
    assert set(check(draw(ONE, ONE_AT), ONE).attributes) == {"color", "shape", "size", "place", "background"}
    assert set(check(draw(TWO, *TWO_AT), TWO).attributes) == {
        "color1", "shape1", "color2", "shape2", "relation", "background"}


@pytest.mark.parametrize("caption, wrong", [
    ("a small blue circle at the top left on a white background", "color"),
    ("a small red square at the top left on a white background", "shape"),
    ("a small red triangle at the top left on a white background", "shape"),
    ("a large red circle at the top left on a white background", "size"),
    ("a small red circle at the bottom left on a white background", "place"),
    ("a small red circle at the top on a white background", "place"),
    ("a small red circle at the top left on a black background", "background"),
])
def test_one_object_image_fails_exactly_the_changed_attribute(caption, wrong):
    result = check(draw(ONE, ONE_AT), caption)
    assert [name for name, ok in result.attributes.items() if not ok] == [wrong]
    assert not result.exact and result.accuracy == pytest.approx(4 / 5)


@pytest.mark.parametrize("caption, wrong", [
    ("an orange square below a blue triangle on a gray background", ["relation"]),
    ("an orange square left of a blue triangle on a gray background", ["relation"]),
    ("an orange circle above a blue triangle on a gray background", ["shape1"]),
    ("an orange square above a blue square on a gray background", ["shape2"]),
    ("a green square above a blue triangle on a gray background", ["color1"]),
    ("an orange square above a blue triangle on a white background", ["background"]),
    # Swapping the colours keeps both shapes wrong and the relation reversed.
    ("a blue square above an orange triangle on a gray background", ["shape1", "shape2", "relation"]),
])
def test_two_object_image_fails_the_changed_attributes(caption, wrong):
    result = check(draw(TWO, *TWO_AT), caption)
    assert [name for name, ok in result.attributes.items() if not ok] == wrong


def test_blank_image_has_no_objects():
    blank = np.full((32, 32, 3), 255, np.uint8)
    result = check(blank, ONE)
    assert result.attributes == {"color": False, "shape": False, "size": False, "place": False, "background": True}
    assert not check(blank, TWO.replace("gray", "white")).attributes["relation"]


def test_input_formats_agree():
    image = draw(TWO, *TWO_AT)
    for form in (image, to_tensor(image), Image.fromarray(image), image.astype(np.float32) / 255):
        assert check(form, TWO).exact
    with pytest.raises(ValueError, match="square images"):
        check(np.zeros((32, 40, 3), np.uint8), ONE)
    with pytest.raises(ValueError, match="not in the Shapes grammar"):
        check(image, "a photo of a cat")


def test_robust_to_tokenizer_like_damage_and_other_sizes():
    rng = np.random.default_rng(0)
    dataset = ShapesDataset("val", 24, image_size=64)
    for i in range(24):
        clean = render(dataset.scene(i), 64)
        damaged = np.asarray(Image.fromarray(clean).resize((32, 32), Image.BILINEAR).resize((64, 64), Image.BILINEAR),
                             np.float32)
        damaged = gaussian_filter(damaged, (0.8, 0.8, 0)) + rng.normal(0, 6, damaged.shape) + [8, -6, 5]
        damaged = np.clip(damaged, 0, 255).astype(np.uint8)
        result = check(damaged, dataset.caption(i))
        assert result.exact, (dataset.caption(i), result.attributes)


def test_detected_geometry():
    analysis = analyse(draw("a large green square on the right on a black background", (0.8, 0.45, 0.4)))
    assert analysis.background == "black" and len(analysis.objects) == 1
    found = analysis.objects[0]
    assert (found.color, found.shape, found.size, found.place) == ("green", "square", "large", "on the right")
    assert found.x == pytest.approx(0.8, abs=0.02) and found.side == pytest.approx(0.4, abs=0.02)


def test_evaluate_scores_a_batch():
    dataset = ShapesDataset("val", 6)
    images, captions = dataset.batch(range(6))
    result = evaluate(images, captions)
    assert result["accuracy"] == 1.0 and result["exact_match"] == 1.0 and result["n"] == 6
    shuffled = captions[1:] + captions[:1]
    worse = evaluate(images, shuffled)
    assert worse["accuracy"] < 0.8 and worse["exact_match"] < 1.0
    assert set(worse["per_attribute"]) >= {"background"}
    with pytest.raises(ValueError, match="one caption per image"):
        evaluate(images, captions[:2])
