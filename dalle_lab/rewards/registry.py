"""Rewards: plain functions `reward(images, prompts) -> scores`.

`images` are decoded pixels, a float tensor (B, 3, H, W) in [0, 1] (what `vae.decode` returns); `prompts` is a list of
B captions. A reward returns a float32 tensor of B scores on the images' device. Higher is better.

Two kinds:
- score-only rewards (JPEG size, the Shapes checker, the aesthetic predictor, any user callable) feed the
  policy-gradient trainer, which never differentiates through them;
- differentiable rewards (marked `reward.differentiable = True`, built from torch ops only) can also drive reward
  backpropagation (reward_backprop.py).

`get_reward("jpeg_compressibility")` or `get_reward("jpeg_compressibility:1+shapes_faithfulness:0.5")` builds one
from the command line; `weighted_sum({...})` composes callables in code. `RewardWorker` computes rewards in a
background thread so scoring one batch overlaps with sampling the next, as DDPO does.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from dalle_lab.rewards.aesthetic import aesthetic_reward
from dalle_lab.rewards.builtin import (RewardFn, brightness, group_diversity, jpeg_compressibility,
                                       jpeg_incompressibility, negative_total_variation, shapes_exact,
                                       shapes_faithfulness)
from dalle_lab.rewards.clip import clip_score_reward


def is_differentiable(reward: RewardFn) -> bool:
    return bool(getattr(reward, "differentiable", False))


def imported_reward(path: str) -> RewardFn:
    """Your own reward function named as `module.function` (dotted, like an import): reward(images, prompts) ->
    one score per image. It is differentiable for reward backpropagation when it sets `function.differentiable =
    True` (and computes its scores from the images with torch operations)."""
    import importlib

    module_name, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"reward {path!r}: cannot import {module_name} ({err}); put {module_name.split('.')[0]}.py in "
                         "the current folder (python -m dalle_lab.align) or its folder on PYTHONPATH") from None
    function = getattr(module, attr, None)
    if not callable(function):
        raise ValueError(f"reward {path!r}: {module_name} ({module.__file__}) has no function {attr!r}")
    return function


def weighted_sum(terms: Mapping[str, tuple[RewardFn, float]] | Sequence[tuple[RewardFn, float]]) -> RewardFn:
    """Combine rewards: `weighted_sum([(jpeg_compressibility, 1.0), (shapes_faithfulness, 10.0)])`.

    The result is differentiable only when every term is. `.terms` keeps the parts so a trainer can log each.
    """
    items = list(terms.values()) if isinstance(terms, Mapping) else list(terms)
    if not items:
        raise ValueError("weighted_sum needs at least one (reward, weight) pair")

    def combined(images, prompts=None):
        total = None
        for reward, weight in items:
            value = weight * reward(images, prompts)
            total = value if total is None else total + value
        return total

    combined.differentiable = all(is_differentiable(reward) for reward, _ in items)
    combined.terms = items
    combined.__name__ = "+".join(f"{weight:g}*{getattr(reward, '__name__', 'reward')}" for reward, weight in items)
    return combined


BUILTIN_REWARDS: dict[str, RewardFn] = {
    "jpeg_compressibility": jpeg_compressibility,
    "jpeg_incompressibility": jpeg_incompressibility,
    "shapes_faithfulness": shapes_faithfulness,
    "shapes_exact": shapes_exact,
    "negative_total_variation": negative_total_variation,
    "brightness": brightness,
    "group_diversity": group_diversity,
}
# every name --reward takes (the two model rewards need files: get_reward says which)
REWARD_NAMES = tuple(sorted([*BUILTIN_REWARDS, "aesthetic", "clip_score"]))


def get_reward(spec: str | RewardFn, **aesthetic_options) -> RewardFn:
    """A reward from a name or a weighted sum of names: "jpeg_compressibility", "shapes_faithfulness:2+brightness:1".

    "aesthetic" needs `clip_path=` (and optionally `head_path=`, `precision=`) in `aesthetic_options`; "clip_score"
    takes `clip_score_path=` (default: the shipped Shapes CLIP), `precision=` and `device=` from them.
    A callable passes through unchanged.
    """
    if callable(spec):
        return spec
    terms = []
    for part in spec.split("+"):
        name, _, weight_text = part.strip().partition(":")
        try:
            weight = float(weight_text) if weight_text else 1.0
        except ValueError:
            raise ValueError(f"reward term {part!r}: the weight after ':' must be a number") from None
        if name == "aesthetic":
            if not aesthetic_options.get("clip_path"):
                raise ValueError("the aesthetic reward needs the local path of a CLIP ViT-L/14 model "
                                 "(--clip_path DIR, HuggingFace transformers format); nothing is downloaded")
            reward = aesthetic_reward(**aesthetic_options)
        elif name == "clip_score":
            reward = clip_score_reward(aesthetic_options.get("clip_score_path"),
                                       precision=aesthetic_options.get("precision", "fp32"),
                                       device=aesthetic_options.get("device"))
        elif name in BUILTIN_REWARDS:
            reward = BUILTIN_REWARDS[name]
        elif "." in name:
            reward = imported_reward(name)
        else:
            known = ", ".join(REWARD_NAMES)
            raise ValueError(f"unknown reward {name!r}; choose from {known}, your own function as module.function "
                             "(a module on PYTHONPATH or in the current folder), or a weighted sum like a:1+b:0.5")
        terms.append((reward, weight))
    if len(terms) == 1 and terms[0][1] == 1.0:
        return terms[0][0]
    return weighted_sum(terms)
