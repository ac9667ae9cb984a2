"""Credit maps: which image tokens a reward's verdict is about.

A reward scores a whole image, but its verdict is often about a part of it: the Shapes checker says "the shape is
wrong" about the cells where the object is drawn, a detector-based reward (GenEval-style boxes) about the cells of a
box. A reward may say so. Beside its scores (B,) it then gives its score split into parts (B, K) that sum to the
score, and for each part a credit map over the image tokens (B, K, N), N = image_seq_len in raster order, weights
in [0, 1]. K = 1 is one map per image. The policy gradient can then credit each part's advantage to the tokens of
its map only (dalle_lab.align.credit) instead of to every token of the image.

How a reward offers it: a `credit(images, prompts, num_tokens) -> CreditedScores` attribute on the reward callable.
`score_with_credit` asks any reward: a weighted sum concatenates its terms' parts, and a reward without a map gets
one part credited to every token (so uniform credit is the special case, and a sum of mapped and unmapped terms
works).
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import torch


class CreditedScores(NamedTuple):
    scores: torch.Tensor  # (B,) float32: what reward(images, prompts) returns
    parts: torch.Tensor  # (B, K) float32: the scores split into parts; parts.sum(1) == scores
    maps: torch.Tensor  # (B, K, N) float32 in [0, 1]: the image tokens each part is credited to


def uniform_credit(scores: torch.Tensor, num_tokens: int) -> CreditedScores:
    """One part, credited to every token."""
    scores = torch.as_tensor(scores).detach().float().cpu().reshape(-1)
    return CreditedScores(scores, scores[:, None], torch.ones(len(scores), 1, num_tokens))


def concat_credit(items: Sequence[tuple[CreditedScores, float]]) -> CreditedScores:
    """Weighted sum of credited scores: the weighted parts side by side, the maps with them."""
    scores = sum(weight * item.scores for item, weight in items)
    parts = torch.cat([weight * item.parts for item, weight in items], dim=1)
    return CreditedScores(scores, parts, torch.cat([item.maps for item, _ in items], dim=1))


def score_with_credit(reward: Callable, images, prompts: Sequence[str] | None, num_tokens: int) -> CreditedScores:
    """The reward's scores with its credit maps (see the module docstring); uniform where the reward has none."""
    if hasattr(reward, "credit"):
        return reward.credit(images, prompts, num_tokens)
    if getattr(reward, "terms", None):
        return concat_credit([(score_with_credit(term, images, prompts, num_tokens), weight)
                              for term, weight in reward.terms])
    return uniform_credit(reward(images, prompts), num_tokens)
