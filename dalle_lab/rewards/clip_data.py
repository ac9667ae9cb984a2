"""Data for the Shapes CLIP: training batches with hard negative captions, and its zero-shot evaluation.

Training sees only the Shapes "train" split (images and captions, dalle_lab.data.shapes); every caption it reads, hard
negatives included, is a training caption. The evaluation uses "val" (captions never trained on) and "heldout"
(colour-shape pairs never trained on).

Attributes of a caption, as the Shapes grammar has them:
    one object:  color, shape, size, place, background
    two objects: color (either object's), shape (either object's), relation, background
A *variant* of a caption changes one attribute and nothing else; the attribute test asks whether the CLIP ranks an
image's own caption above every variant of it in that attribute.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from dalle_lab.data.shapes import (BACKGROUNDS, PALETTE, PLACES, RELATIONS, SHAPES, SIZES, SceneSpec,
                                   ShapesDataset, describe, parse, split_of)

ATTRIBUTES = ("color", "shape", "size", "place", "relation", "background")
_STREAM_LENGTH = 10 ** 9  # a training "epoch" long enough never to repeat an item


def attributes_of(spec: SceneSpec) -> tuple[str, ...]:
    return ("color", "shape", "size", "place", "background") if len(spec.objects) == 1 else \
        ("color", "shape", "relation", "background")


def variants(spec: SceneSpec, attribute: str) -> list[SceneSpec]:
    """Every valid spec that differs from `spec` in `attribute` only (two objects: in either object's)."""
    if attribute not in attributes_of(spec):
        raise ValueError(f"a {len(spec.objects)}-object caption has no attribute {attribute!r}; "
                         f"expected one of {attributes_of(spec)}")
    out = []
    if attribute in ("color", "shape"):
        values = PALETTE if attribute == "color" else SHAPES
        for k, obj in enumerate(spec.objects):
            others = {o.color for i, o in enumerate(spec.objects) if i != k} if attribute == "color" else set()
            for value in values:
                if value == getattr(obj, attribute) or value in others:
                    continue
                objects = list(spec.objects)
                objects[k] = replace(obj, **{attribute: value})
                out.append(replace(spec, objects=tuple(objects)))
        return out
    values = {"size": SIZES, "place": PLACES, "relation": RELATIONS, "background": BACKGROUNDS}[attribute]
    return [replace(spec, **{attribute: value}) for value in values if value != getattr(spec, attribute)]


def hard_negative(spec: SceneSpec, rng: np.random.Generator) -> str:
    """A training caption that differs from `spec` in one attribute, for the contrastive loss: drawn uniformly from
    all such captions, so attributes with more values (place: 8 others) come up more often."""
    candidates = [v for attribute in attributes_of(spec) for v in variants(spec, attribute) if split_of(v) == "train"]
    return describe(candidates[int(rng.integers(len(candidates)))])


def training_batch(step: int, batch_size: int, seed: int, image_size: int = 32, hard_negatives: int = 1):
    """Batch `step` of the training stream: (images (B,3,H,W), captions, `hard_negatives` x B negative captions, the
    k-th block of B holding one per image). Deterministic."""
    dataset = ShapesDataset("train", _STREAM_LENGTH, image_size=image_size, seed=seed)
    start = step * batch_size
    if start + batch_size > _STREAM_LENGTH:
        raise ValueError(f"step {step} x batch {batch_size} runs past the training stream")
    scenes = [dataset.scene(i) for i in range(start, start + batch_size)]
    images, captions = dataset.batch(range(start, start + batch_size))
    rng = np.random.default_rng((seed, 7, step))
    negatives = [hard_negative(scene.spec, rng) for _ in range(hard_negatives) for scene in scenes]
    return images, captions, negatives


def augment(images: torch.Tensor, generator: torch.Generator, blur_prob: float = 0.5, max_sigma: float = 1.0,
            noise_std: float = 0.02) -> torch.Tensor:
    """Blur some images (Gaussian, random sigma up to `max_sigma` px) and add pixel noise: a decoded VQGAN image is
    a softened, slightly noisy render, and the reward must score those, not only clean renders."""
    batch = images.shape[0]
    sigma = torch.rand(batch, generator=generator) * max_sigma
    sigma = torch.where(torch.rand(batch, generator=generator) < blur_prob, sigma, torch.zeros_like(sigma))
    offsets = torch.arange(-2, 3, dtype=images.dtype)
    kernel = torch.exp(-offsets[None] ** 2 / (2 * sigma.clamp(min=1e-3)[:, None] ** 2))
    kernel = kernel / kernel.sum(-1, keepdim=True)  # (B, 5); sigma ~0 gives the identity
    padded = F.pad(images, (2, 2, 2, 2), mode="replicate")
    rows = sum(kernel[:, i, None, None, None] * padded[..., i:i + images.shape[-2], :] for i in range(5))
    out = sum(kernel[:, i, None, None, None] * rows[..., i:i + images.shape[-1]] for i in range(5))
    noise = torch.randn(out.shape, generator=generator) * noise_std
    return (out + noise).clamp(0, 1)


# ------------------------------------------------------------------------------------------------ evaluation

def _attribute_value(spec: SceneSpec, attribute: str):
    if attribute in ("color", "shape"):
        return tuple(getattr(obj, attribute) for obj in spec.objects)
    return getattr(spec, attribute)


@torch.no_grad()
def evaluate_retrieval(scorer, split: str = "val", n: int = 100, seed: int = 0, batch_size: int = 100) -> dict:
    """Zero-shot retrieval and attribute tests of a ClipScorer on the first `n` items of a Shapes split.

    - caption_to_image_top1: for each caption, is the most similar of the n images one with that caption?
      (a caption can occur more than once among n items; any image of it counts as right);
    - image_to_caption_top1: the same the other way, among the n captions;
    - retrieval_attribute: of the images each caption retrieves, the fraction right in each attribute;
    - attribute_test: the fraction of images whose own caption scores above every variant in that attribute
      (`all`: above every variant in any attribute at once).
    """
    dataset = ShapesDataset(split, n, image_size=scorer.image_size, seed=seed)
    images, captions = dataset.batch(range(n))
    specs = [parse(caption) for caption in captions]
    image_embeds = torch.cat([scorer.encode_images(images[i:i + batch_size])[1] for i in range(0, n, batch_size)])
    text_embeds = scorer.encode_text(captions)
    similarity = text_embeds @ image_embeds.T  # (caption, image)
    to_image = similarity.argmax(1).tolist()
    to_caption = similarity.argmax(0).tolist()
    report = {"split": split, "n": n, "seed": seed,
              "caption_to_image_top1": float(np.mean([captions[j] == captions[i] for i, j in enumerate(to_image)])),
              "image_to_caption_top1": float(np.mean([captions[j] == captions[i] for i, j in enumerate(to_caption)]))}
    retrieval = {a: [] for a in ATTRIBUTES}
    for i, j in enumerate(to_image):
        for attribute in attributes_of(specs[i]):
            same_kind = len(specs[j].objects) == len(specs[i].objects)
            retrieval[attribute].append(same_kind and _attribute_value(specs[j], attribute) ==
                                        _attribute_value(specs[i], attribute))
    report["retrieval_attribute"] = {a: float(np.mean(v)) for a, v in retrieval.items() if v}
    tests = {a: [] for a in (*ATTRIBUTES, "all")}
    for i, spec in enumerate(specs):
        every = []
        for attribute in attributes_of(spec):
            others = [describe(v) for v in variants(spec, attribute)]
            every += others
            scores = scorer.encode_text([captions[i], *others]) @ image_embeds[i]
            tests[attribute].append(bool(scores[0] > scores[1:].max()))
        scores = scorer.encode_text([captions[i], *every]) @ image_embeds[i]
        tests["all"].append(bool(scores[0] > scores[1:].max()))
    report["attribute_test"] = {a: float(np.mean(v)) for a, v in tests.items() if v}
    report["attribute_test_n"] = {a: len(v) for a, v in tests.items() if v}
    return report


def matched_vs_mismatched(scorer, captions: Sequence[str], images) -> tuple[torch.Tensor, torch.Tensor]:
    """(CLIPScore of each image with its caption, with the next image's caption): a shuffled-caption baseline."""
    shuffled = list(captions[1:]) + list(captions[:1])
    with torch.no_grad():
        return scorer(images, list(captions)), scorer(images, shuffled)
