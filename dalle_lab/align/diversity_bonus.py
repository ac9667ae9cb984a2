"""A diversity bonus among each group's best samples, against the mode collapse of group-based policy gradient.

Why: with group advantages, the samples of a caption that score best are pushed up together, and whatever they
happen to share (where the object sits, how large it is within its size class) is pushed up with them. Step by step
the policy sharpens onto one layout per caption: on the Shapes model, 900 s of RL on held-out compositions made the
correct images of a caption 25 % less varied in their objects' positions and sizes (docs/align.md). A bonus for
differing from the rest of the group counters this; rewarding every sample for differing would also reward errors,
since a stray extra object makes an image differ too (measured: extra objects per image +38 %).

So the bonus goes to the group's best samples only (score within `tolerance` of the group's maximum) and is centred
among them: each gets `weight` times its mean pixel distance (mean absolute difference, in [0, 1]) to the group's
other best samples, minus the mean of that over those samples. It sums to zero within every group, so it never
changes a group's mean reward or the ranking between a best sample and a worse one by more than the spread of
distances among the best; it only tells the policy which of several equally good images to prefer: the ones unlike
the others. A group with fewer than two best samples gets no bonus. The bonus is one more reward part, credited to
every image token (dalle_lab.rewards.credit). It is computed where the reward is, batch by batch of sampling: a group
split over two batches is compared within each part (the trainer says so at the start; the defaults keep groups
whole).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from dalle_lab.rewards.builtin import mean_distance_to_others
from dalle_lab.rewards.credit import CreditedScores, concat_credit, uniform_credit
from dalle_lab.stats import groups_of


def best_sample_diversity(images: torch.Tensor, prompts: Sequence[str], scores: torch.Tensor,
                          tolerance: float = 1e-6) -> torch.Tensor:
    """(B,) the centred diversity of the module docstring (before the weight); 0 outside each group's best."""
    flat = torch.as_tensor(images).detach().float().flatten(1).cpu()
    scores = torch.as_tensor(scores).detach().double().reshape(-1).cpu()
    if len(prompts) != len(flat) or len(scores) != len(flat):
        raise ValueError(f"the diversity bonus needs one caption and one score per image, got {len(prompts)} "
                         f"captions and {len(scores)} scores for {len(flat)} images")
    bonus = torch.zeros(len(flat))
    for members in groups_of(prompts):
        group_scores = scores[members]
        best = [m for m, s in zip(members, group_scores.tolist()) if s >= float(group_scores.max()) - tolerance]
        if len(best) > 1:
            distances = mean_distance_to_others(flat[best])
            bonus[best] = (distances - distances.mean()).float()
    return bonus


def with_diversity_bonus(credited: CreditedScores, images, prompts: Sequence[str], weight: float) -> CreditedScores:
    """The credited scores plus `weight` times the best samples' centred diversity, as one more uniform part."""
    bonus = best_sample_diversity(images, prompts, credited.scores)
    return concat_credit([(credited, 1.0), (uniform_credit(bonus, credited.maps.shape[-1]), weight)])


def scoring_with_bonus(images, prompts: Sequence[str], scoring: Callable, weight: float) -> CreditedScores:
    """scoring(images, prompts) -> CreditedScores, with the diversity bonus added (what the reward worker runs)."""
    credited = scoring(images, prompts)
    return with_diversity_bonus(credited, images, prompts, weight) if weight else credited
