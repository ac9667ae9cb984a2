"""Question (a) of the loss-weighting study: which objects / caption positions generated images get right.

Images are rendered Shapes scenes, some drawn for a different caption than the one they are checked against, so
the expected counts are known by construction."""
import json
import math

import numpy as np
import pytest
import torch

from dalle_lab.data.checker import evaluate
from dalle_lab.data.shapes import layout, parse, render
from dalle_lab.evaluate.objects import (
    aggregate_breakdowns,
    breakdown_from_attributes,
    object_breakdown,
)

TARGET_TWO = "a red circle above a blue square on a white background"
TARGET_ONE = "a small red circle at the top left on a white background"


def draw(caption: str, seed: int) -> np.ndarray:
    """A clean 32-px render of `caption`'s scene (random layout that matches it)."""
    return render(layout(parse(caption), np.random.default_rng(seed)), 32)


def constructed_samples():
    """(images, captions, how many of each outcome): every image is checked against TARGET_TWO / TARGET_ONE."""
    drawn_for = {
        "both": [TARGET_TWO] * 3,
        "first_only": ["a red circle above a green square on a white background",  # second colour wrong
                       "a red circle above a blue circle on a white background",  # second shape wrong
                       "a red circle above a purple square on a white background"],
        "second_only": ["a green circle above a blue square on a white background",  # first colour wrong
                        "a red triangle above a blue square on a white background"],  # first shape wrong
        "neither": ["a green triangle above a yellow circle on a white background"] * 2,
    }
    images, captions = [], []
    for drawn in drawn_for.values():
        for caption in drawn:
            images.append(draw(caption, seed=len(images)))
            captions.append(TARGET_TWO)
    # one-object captions must not count as objects: the first is right, the others wrong in one attribute each
    for caption in (TARGET_ONE, "a large red circle at the top left on a white background",
                    "a small red circle at the bottom right on a white background",
                    "a small red circle at the top left on a black background"):
        images.append(draw(caption, seed=len(images)))
        captions.append(TARGET_ONE)
    return images, captions, {outcome: len(drawn) for outcome, drawn in drawn_for.items()}


def test_object_shares_and_position_accuracy_on_constructed_images():
    images, captions, expected = constructed_samples()
    result = object_breakdown(images, captions)
    json.dumps(result, allow_nan=False)  # plain, strict JSON
    assert result["n"] == 14
    objects = result["objects"]
    assert objects["n"] == 10
    assert objects["counts"] == expected
    assert objects["shares"] == {name: count / 10 for name, count in expected.items()}
    assert objects["shares"] == {"both": 0.3, "first_only": 0.3, "second_only": 0.2, "neither": 0.2}

    one = result["positions"]["one_object"]
    assert one["n"] == 4 and one["order"] == ["size", "color", "shape", "place", "background"]
    assert one["accuracy"] == {"size": 0.75, "color": 1.0, "shape": 1.0, "place": 0.75, "background": 0.75}
    two = result["positions"]["two_objects"]
    assert two["n"] == 10 and two["order"] == ["color1", "shape1", "relation", "color2", "shape2", "background"]
    # colours are right exactly where the construction says: red is drawn first in 7 images, blue second in 6
    assert two["accuracy"]["color1"] == 0.7 and two["accuracy"]["color2"] == 0.6
    assert two["accuracy"]["background"] == 1.0


def test_images_may_be_a_float_batch_tensor():
    images, captions, _ = constructed_samples()
    batch = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255
    assert object_breakdown(batch, captions) == object_breakdown(images, captions)
    with pytest.raises(ValueError, match="one caption per image"):
        object_breakdown(images, captions[:-1])


def test_positions_follow_caption_order_on_hand_made_verdicts():
    two = dict(color1=True, shape1=False, relation=True, color2=False, shape2=False, background=True)
    one = dict(color=True, shape=True, size=False, place=False, background=True)  # the checker's key order
    result = breakdown_from_attributes([two, two, one])
    assert result["objects"]["counts"] == {"both": 0, "first_only": 0, "second_only": 0, "neither": 2}
    assert list(result["positions"]["one_object"]["accuracy"].values()) == [0.0, 1.0, 1.0, 0.0, 1.0]
    assert list(result["positions"]["two_objects"]["accuracy"].values()) == [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    # no two-object captions at all: shares are None (strict JSON), counts zero
    only_one = breakdown_from_attributes([one])
    assert only_one["objects"]["n"] == 0 and set(only_one["objects"]["shares"].values()) == {None}
    assert only_one["positions"]["two_objects"]["accuracy"]["color1"] is None
    with pytest.raises(ValueError, match="not Shapes checker verdicts"):
        breakdown_from_attributes([{"accuracy": 1.0}])


def seed_breakdown(both: int, first_only: int, second_only: int, neither: int) -> dict:
    verdict = {"both": (True, True), "first_only": (True, False), "second_only": (False, True),
               "neither": (False, False)}
    attributes = []
    for outcome, count in (("both", both), ("first_only", first_only), ("second_only", second_only),
                           ("neither", neither)):
        first, second = verdict[outcome]
        attributes += [dict(color1=first, shape1=first, relation=True, color2=second, shape2=second,
                            background=True)] * count
    return breakdown_from_attributes(attributes)


def test_aggregate_over_seeds_is_the_student_t_interval():
    # first_only shares 0.1, 0.2, 0.3 over three seeds of 10 samples: mean 0.2, s = 0.1, t(0.975, 2) closed form
    seeds = [seed_breakdown(5, 1, 2, 2), seed_breakdown(4, 2, 2, 2), seed_breakdown(3, 3, 2, 2)]
    result = aggregate_breakdowns(seeds)
    a = 0.025
    t = (1 - 2 * a) / math.sqrt(2 * a * (1 - a))  # 4.3027
    first_only = result["objects"]["shares"]["first_only"]
    assert first_only["mean"] == pytest.approx(0.2, abs=1e-12)
    assert first_only["std"] == pytest.approx(0.1, abs=1e-12)
    assert first_only["half_width"] == pytest.approx(t * 0.1 / math.sqrt(3), rel=1e-9)
    assert (first_only["low"], first_only["high"]) == pytest.approx((0.2 - t * 0.1 / math.sqrt(3),
                                                                      0.2 + t * 0.1 / math.sqrt(3)))
    assert first_only["n"] == 3 and first_only["confidence"] == 0.95
    second_only = result["objects"]["shares"]["second_only"]  # 0.2 in every seed: zero-width interval
    assert second_only["mean"] == pytest.approx(0.2) and second_only["half_width"] == pytest.approx(0.0, abs=1e-12)
    assert result["n_seeds"] == 3 and result["objects"]["n"] == 30
    assert result["objects"]["counts"] == {"both": 12, "first_only": 6, "second_only": 6, "neither": 6}
    color1 = result["positions"]["two_objects"]["accuracy"]["color1"]  # both + first_only: 0.6 in every seed
    assert color1["mean"] == pytest.approx(0.6) and color1["half_width"] == pytest.approx(0.0, abs=1e-12)
    # no seed had one-object captions: no interval, not a crash
    assert result["positions"]["one_object"]["accuracy"]["size"] is None
    # a seed without two-object captions adds no share: the interval is over the seeds that had some
    partial = aggregate_breakdowns(seeds + [breakdown_from_attributes([dict(
        size=True, color=True, shape=True, place=True, background=True)])])
    assert partial["objects"]["shares"]["first_only"] == first_only
    assert partial["positions"]["one_object"]["accuracy"]["size"]["n"] == 1
    assert math.isnan(partial["positions"]["one_object"]["accuracy"]["size"]["half_width"])  # one seed
    with pytest.raises(ValueError, match="at least one"):
        aggregate_breakdowns([])


def test_evaluate_model_adds_the_breakdown_and_keeps_its_keys(monkeypatch):
    from dalle_lab.evaluate import shapes as shapes_eval

    captured = {}

    def fake_losses(model, vae, tokenizer, split, n, seed=0, batch_size=32):
        return {"loss_text": 1.0, "loss_img": 2.0, "loss_text_caption": 3.0, "n": n}

    def fake_generation(model, vae, tokenizer, captions, settings):
        # stands in for sampling: each caption's own scene, except every third image is drawn for the next caption
        drawn = [captions[(k + 1) % len(captions)] if k % 3 == 2 else caption for k, caption in enumerate(captions)]
        images = torch.from_numpy(np.stack([draw(c, seed=k) for k, c in enumerate(drawn)]))
        images = images.permute(0, 3, 1, 2).float() / 255
        captured[len(captured)] = (images, captions)
        return evaluate(images, captions), images

    monkeypatch.setattr(shapes_eval, "heldout_losses", fake_losses)
    monkeypatch.setattr(shapes_eval, "generation_scores", fake_generation)
    settings = shapes_eval.EvalSettings(n_val=6, n_heldout=6, n_loss=4)
    numbers, images = shapes_eval.evaluate_model(None, None, None, settings)
    for k, split in enumerate(("val", "heldout")):
        split_numbers = numbers[split]
        assert {"loss_text", "loss_img", "loss_text_caption", "n", "accuracy", "exact_match", "per_attribute",
                "n_generated", "objects"} == set(split_numbers)
        generated, captions = captured[k]
        assert split_numbers["objects"] == object_breakdown(generated, captions)
        assert split_numbers["objects"]["n"] == 6
    json.dumps(numbers, allow_nan=False)
