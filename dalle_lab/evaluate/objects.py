"""Which parts of a caption does a generated Shapes image get right? (loss-weighting study, question (a))

The question, from the CogView discussion: with loss_img_weight 1, do generations "match maybe just one word in the
caption rather than the full caption"? The checker's overall accuracy cannot tell "half of every image is right"
from "every image shows one object of the two", so this module splits the verdicts two ways:

- objects: for two-object captions, is only the first object right (its colour AND its shape), only the second,
  both, or neither? A model that draws just one object of the caption puts its mass in first_only/second_only;
  one that favours the first-mentioned object shows first_only > second_only.
- positions: each attribute's accuracy in the order its words appear in the caption, so a report can show whether
  accuracy falls with the word's position (one object: size, color, shape, place, background; two objects: color1,
  shape1, relation, color2, shape2, background). Attribute names are the checker's (dalle_lab/data/checker.py).

Everything returned is plain dicts, lists, ints and floats (JSON-serialisable); a share over no samples is None,
not nan, so a split without two-object captions still writes strict JSON.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

# Attributes in the order their words appear in the caption (dalle_lab/data/shapes.py's grammar).
ONE_OBJECT_ORDER: tuple[str, ...] = ("size", "color", "shape", "place", "background")
TWO_OBJECT_ORDER: tuple[str, ...] = ("color1", "shape1", "relation", "color2", "shape2", "background")
# The four outcomes of a two-object caption, by which objects are right (colour and shape both match).
OBJECT_OUTCOMES: tuple[str, ...] = ("both", "first_only", "second_only", "neither")
KINDS: tuple[str, ...] = ("one_object", "two_objects")


def _share(count: int, total: int) -> float | None:
    return count / total if total else None


def object_outcome(attributes: Mapping[str, bool]) -> str:
    """"both", "first_only", "second_only" or "neither" for one two-object caption's checker verdicts.

    An object is right when its colour AND its shape are: a red square drawn for "a red circle" did not draw the
    object the caption asked for. Relation and background are left out on purpose: they are attributes of the
    scene, reported by position, not of either object.
    """
    first = bool(attributes["color1"]) and bool(attributes["shape1"])
    second = bool(attributes["color2"]) and bool(attributes["shape2"])
    if first and second:
        return "both"
    if first:
        return "first_only"
    return "second_only" if second else "neither"


def breakdown_from_attributes(attributes: Sequence[Mapping[str, bool]]) -> dict:
    """The breakdown of per-sample checker verdicts (`CheckResult.attributes`, one dict per generated image).

    The caption's kind is read from the verdicts' keys (one-object verdicts have "size", two-object ones "color1"),
    so no caption parsing is repeated. Returns:

        {"n": all samples,
         "objects": {"n": two-object samples,
                     "counts": {"both": int, "first_only": int, "second_only": int, "neither": int},
                     "shares": {same keys: count / n, or None when n == 0}},
         "positions": {"one_object":  {"n": int, "order": [attribute names in caption order],
                                       "accuracy": {name: share right, or None when n == 0}},
                       "two_objects": {... the same ...}}}
    """
    counts = dict.fromkeys(OBJECT_OUTCOMES, 0)
    correct = {kind: dict.fromkeys(order, 0) for kind, order in zip(KINDS, (ONE_OBJECT_ORDER, TWO_OBJECT_ORDER))}
    totals = dict.fromkeys(KINDS, 0)
    for verdicts in attributes:
        if "color1" in verdicts:
            kind = "two_objects"
            counts[object_outcome(verdicts)] += 1
        elif "size" in verdicts:
            kind = "one_object"
        else:
            raise ValueError(f"not Shapes checker verdicts (no 'size' or 'color1'): {sorted(verdicts)}")
        totals[kind] += 1
        for name in correct[kind]:
            correct[kind][name] += bool(verdicts[name])
    n_two = totals["two_objects"]
    return {
        "n": sum(totals.values()),
        "objects": {"n": n_two, "counts": counts,
                    "shares": {name: _share(count, n_two) for name, count in counts.items()}},
        "positions": {kind: {"n": totals[kind], "order": list(correct[kind]),
                             "accuracy": {name: _share(k, totals[kind]) for name, k in correct[kind].items()}}
                      for kind in KINDS},
    }


def object_breakdown(images: Iterable, captions: Sequence[str]) -> dict:
    """Check each image against its caption with the Shapes checker and break the verdicts down (see
    `breakdown_from_attributes` for the dict). `images`: a (B, 3, H, W) tensor in [0, 1] or any iterable of images
    `dalle_lab.data.checker.check` accepts, one per caption."""
    from dalle_lab.data.checker import check

    images = list(images)
    if len(images) != len(captions):
        raise ValueError(f"object_breakdown needs one caption per image, got {len(images)} images and "
                         f"{len(captions)} captions")
    return breakdown_from_attributes([check(image, caption).attributes for image, caption in zip(images, captions)])


def aggregate_breakdowns(breakdowns: Sequence[dict], confidence: float = 0.95) -> dict:
    """Mean and Student-t interval across seeds of each share in per-seed breakdowns (one dict per seed, as
    `object_breakdown` returns; the seeds' shares, not their pooled counts, are the samples, so seed-to-seed
    variation shows in the interval). Each leaf is `stats.mean_ci(values).to_dict()`:
    {"mean", "half_width", "n" (seeds that had a value), "std", "confidence", "low", "high"}; half_width is nan with
    one seed (mean_ci's convention) and a leaf is None when no seed had a value. Returns:

        {"n_seeds": int,
         "objects": {"shares": {"both": interval, "first_only": ..., "second_only": ..., "neither": ...},
                     "counts": {outcome: summed over seeds}, "n": summed over seeds},
         "positions": {"one_object":  {"order": [...], "accuracy": {name: interval}, "n": summed over seeds},
                       "two_objects": {...}}}
    """
    from dalle_lab.stats import mean_ci

    if not breakdowns:
        raise ValueError("aggregate_breakdowns needs at least one seed's breakdown")

    def interval(values: Iterable[float | None]) -> dict | None:
        present = [v for v in values if v is not None]  # a seed without such captions has no share to add
        return mean_ci(present, confidence).to_dict() if present else None

    objects = {
        "shares": {name: interval(b["objects"]["shares"][name] for b in breakdowns) for name in OBJECT_OUTCOMES},
        "counts": {name: sum(b["objects"]["counts"][name] for b in breakdowns) for name in OBJECT_OUTCOMES},
        "n": sum(b["objects"]["n"] for b in breakdowns),
    }
    positions = {}
    for kind in KINDS:
        order = list(breakdowns[0]["positions"][kind]["order"])
        positions[kind] = {
            "order": order,
            "accuracy": {name: interval(b["positions"][kind]["accuracy"][name] for b in breakdowns)
                         for name in order},
            "n": sum(b["positions"][kind]["n"] for b in breakdowns),
        }
    return {"n_seeds": len(breakdowns), "objects": objects, "positions": positions}


__all__ = ["KINDS", "OBJECT_OUTCOMES", "ONE_OBJECT_ORDER", "TWO_OBJECT_ORDER", "aggregate_breakdowns",
           "breakdown_from_attributes", "object_breakdown", "object_outcome"]
