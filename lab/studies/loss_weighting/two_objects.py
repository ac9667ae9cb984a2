"""The powered two-object evaluation: which objects of a two-object caption each image gets right, on enough images
to see a difference of a few percent between two trained models (issue 39).

Each run draws `samples` images for each of the first `n_val` two-object validation items and `n_heldout` two-object
held-out items, under each named sampling, from fixed seeds: every run sees the same captions and the same sampling
seeds, so two settings' runs of one training seed can be compared caption by caption. Each image's outcome (both
objects right, first only, second only, neither; dalle_lab.evaluate.objects) is stored as one letter, so the report
can pair runs per caption and per seed.

The validation split has only 218 distinct two-object captions, so 400 validation items repeat some captions (each
item is its own draw of the split's stream; the report groups items by caption text when it pairs them).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from dalle_lab.evaluate.objects import OBJECT_OUTCOMES, object_outcome

# one letter per outcome in a run's stored string, and back
CODES = {"both": "B", "first_only": "F", "second_only": "S", "neither": "N"}
OUTCOME_OF = {code: outcome for outcome, code in CODES.items()}
assert set(CODES) == set(OBJECT_OUTCOMES)

# name -> (top_k, top_p, temperature, cond_scale). "default" is generate.py's (GenerationConfig()'s sampling,
# calibrated on the main job's model); "plain" is the model's own distribution, the sampling of the 600-step study
# (no top-k, temperature 1, no guidance)
SAMPLINGS = {"default": (10, None, 0.7, 2.0), "plain": (None, None, 1.0, 1.0)}
SPLITS = ("val", "heldout")


@dataclass(frozen=True)
class TwoObjectEval:
    n_val: int = 400  # two-object validation items (unseen captions of seen colour-shape pairs)
    n_heldout: int = 200  # two-object held-out items (colour-shape pairs never trained on)
    samples: int = 2  # images per item, each from its own fixed sampling seed
    seed: int = 0  # which items (the split's stream) and the base of the sampling seeds
    samplings: tuple[str, ...] = ("default", "plain")
    batch_size: int = 50

    def check(self) -> None:
        unknown = [name for name in self.samplings if name not in SAMPLINGS]
        if unknown:
            raise ValueError(f"unknown two-object sampling {unknown}; choose from {sorted(SAMPLINGS)}")
        if min(self.n_val, self.n_heldout) < 0 or self.samples < 1 or self.batch_size < 1:
            raise ValueError("two-object evaluation: item counts must be >= 0, samples and batch_size >= 1")

    def to_dict(self) -> dict:
        """The settings, with each named sampling's numbers (so a changed sampling is a changed evaluation)."""
        return asdict(self) | {"sampling_settings": {name: list(SAMPLINGS[name]) for name in self.samplings}}

    def sampling_seed(self, split: str, sample: int) -> int:
        """The generator seed of one split's k-th sample: fixed, distinct per split and sample, the same in every
        run (so w=1 and w=7 of a training seed draw with the same random stream)."""
        return 1000 * self.seed + 100 * SPLITS.index(split) + sample


def two_object_captions(split: str, n: int, seed: int = 0) -> list[str]:
    """Captions of the first n two-object items of ShapesDataset(split, seed)'s stream (the same for every run)."""
    from dalle_lab.data.shapes import describe, sample_scene

    captions, index = [], 0
    while len(captions) < n:
        scene = sample_scene(split, index, seed)
        if len(scene.spec.objects) == 2:
            captions.append(describe(scene))
        index += 1
    return captions


def outcome_string(images, captions) -> str:
    """One letter per image (B, F, S, N) from the Shapes checker's verdicts on it."""
    from dalle_lab.data.checker import check

    return "".join(CODES[object_outcome(check(image, caption).attributes)] for image, caption in zip(images, captions))


def evaluate_two_objects(model, vae, tokenizer, settings: TwoObjectEval) -> dict:
    """{sampling: {split: {"n_items", "outcomes": [one string per sample, a letter per item]}}} for one model."""
    import torch

    from dalle_lab.generate import GenerationConfig
    from dalle_lab.generate.folders import sample_images

    was_training = model.training
    model.eval()
    out = {}
    try:
        for name in settings.samplings:
            top_k, top_p, temperature, cond_scale = SAMPLINGS[name]
            sampling = GenerationConfig(top_k=top_k, top_p=top_p, temperature=temperature, cond_scale=cond_scale)
            out[name] = {}
            for split, n in (("val", settings.n_val), ("heldout", settings.n_heldout)):
                captions = two_object_captions(split, n, settings.seed)
                strings = []
                for k in range(settings.samples):
                    with torch.no_grad():
                        images = sample_images(model, vae, tokenizer, captions, sampling,
                                               seed=settings.sampling_seed(split, k), batch_size=settings.batch_size)
                    strings.append(outcome_string(images, captions))
                out[name][split] = {"n_items": n, "outcomes": strings}
    finally:
        model.train(was_training)
    return out


def shares(outcomes: list[str]) -> dict:
    """Share of each outcome over all images of one run's split (every sample of every item), and "only_one"."""
    letters = "".join(outcomes)
    counts = {outcome: letters.count(code) for outcome, code in CODES.items()}
    total = len(letters)
    result = {outcome: count / total for outcome, count in counts.items()} if total else {}
    if total:
        result["only_one"] = result["first_only"] + result["second_only"]
    return result


def indicator(code: str, category: str) -> float:
    """1.0 when an image's letter is in `category` (an outcome or "only_one"), else 0.0."""
    if category == "only_one":
        return float(code in "FS")
    return float(code == CODES[category])


CATEGORIES = ("both", "first_only", "second_only", "neither", "only_one")

__all__ = ["CATEGORIES", "CODES", "SAMPLINGS", "TwoObjectEval", "evaluate_two_objects", "indicator",
           "outcome_string", "shares", "two_object_captions"]
