"""Which of an image's tokens its advantage is credited to, for the policy gradient (`credit`).

An image's reward arrives once, for all its `image_seq_len` tokens. Giving every token the image's advantage
("uniform", DDPO's and GRPO's choice) pays one noise term per token: in a group of seven exact Shapes images and one
that misses an attribute, the miss gets the same negative advantage on every token, the plain background included,
although the checker saw the error in the cells of one object. Three choices:

- `uniform`: every token gets its image's advantage;
- `localized`: the reward's own credit maps (dalle_lab.rewards.credit): the score is split into parts, each with the
  tokens it is about, and each part's advantage goes to its tokens only. For the Shapes rewards the parts are the
  checker's attributes, each credited to the cells of the object it judged (background: the cells outside objects);
  a reward without maps falls back to uniform credit;
- `content`: the image's advantage goes to the tokens whose cell shows something other than the background (the
  median colour of the image's border; an image with nothing drawn keeps uniform credit). The issue-13 heuristic:
  it did not change the gradient's noise (lab/studies/align/results/gradient_noise.json), kept for rewards without
  maps whose signal sits in few cells of a plain background.

Per token, with parts p_ik of image i (k = 1..K), maps m_ikt, the group mean of each part and the scale s_i (one
over the group's or the batch's reward std, stat_tracking.py), the advantage is
    A_it = s_i * sum_k (p_ik - mean_group(p_k)) * m_ikt,
which with every map equal to one is the image's group advantage s_i (r_i - mean_group(r)) on every token.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from dalle_lab.align.config import CREDITS
from dalle_lab.align.stat_tracking import centred_parts, flat_groups, reward_scale
from dalle_lab.rewards.credit import CreditedScores, score_with_credit, uniform_credit

# A cell counts as content when some pixel differs from the background by more than this in a channel (images in
# [0, 1]). Decoded background cells of the Shapes VQGAN stay below 0.05; object cells, edges included, above 0.1.
CONTENT_THRESHOLD = 0.1


def background_colour(images: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) images -> (B, 3): the per-channel median of the border pixels."""
    border = torch.cat([images[:, :, 0], images[:, :, -1], images[:, :, 1:-1, 0], images[:, :, 1:-1, -1]], dim=-1)
    return border.median(dim=-1).values


def content_cells(images: torch.Tensor, grid: int, threshold: float = CONTENT_THRESHOLD) -> torch.Tensor:
    """(B, grid * grid) bool in raster (token) order: cells where some pixel differs from the background colour by
    more than `threshold` in some channel."""
    b, _, h, w = images.shape
    if h % grid or w % grid:
        raise ValueError(f"images of {h}x{w} pixels do not split into a {grid}x{grid} token grid")
    deviation = (images.float() - background_colour(images.float())[:, :, None, None]).abs().amax(dim=1)
    cells = deviation.reshape(b, grid, h // grid, grid, w // grid).amax(dim=(2, 4))
    return (cells > threshold).reshape(b, grid * grid)


def content_map(images: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """(B, num_tokens) float: 1 on content cells, 0 on background cells; all 1 for an image without content."""
    grid = int(round(num_tokens ** 0.5))
    if grid * grid != num_tokens:
        raise ValueError(f"content credit needs a square token grid, got {num_tokens} image tokens")
    content = content_cells(images, grid).float().cpu()
    return torch.where(content.sum(dim=1, keepdim=True) == 0, torch.ones_like(content), content)


def credited_scores(reward: Callable, images, prompts: Sequence[str], num_tokens: int, kind: str) -> CreditedScores:
    """The reward's scores with the credit maps of `kind` (CREDITS)."""
    if kind not in CREDITS:
        raise ValueError(f"credit must be one of {', '.join(CREDITS)}, not {kind!r}")
    if kind == "localized":
        credited = score_with_credit(reward, images, prompts, num_tokens)
        checked_scores(credited.scores, prompts)
        return credited
    credited = uniform_credit(checked_scores(reward(images, prompts), prompts), num_tokens)
    if kind == "content":
        return credited._replace(maps=content_map(images, num_tokens)[:, None])
    return credited


def checked_scores(scores, prompts: Sequence[str]) -> torch.Tensor:
    """A reward's output as a (B,) float tensor, or a ValueError naming what is wrong with it: one finite score per
    image. A NaN or inf would turn the advantages, the loss and then every weight into NaN, silently."""
    try:
        values = torch.as_tensor(scores.detach() if torch.is_tensor(scores) else scores, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"the reward returned {type(scores).__name__}, not one number per image ({err})") from None
    if values.shape != (len(prompts),):
        raise ValueError(f"the reward returned scores of shape {tuple(values.shape)} for {len(prompts)} images: it "
                         "must return one score per image, shape (B,)")
    bad = (~torch.isfinite(values)).nonzero().flatten()
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"the reward returned {values[i].item()} for the image of {prompts[i]!r} ({len(bad)} of "
                         f"{len(prompts)} scores not finite): fix the reward; a NaN or inf would make every weight NaN")
    return values


def token_advantages(prompts: Sequence[str], credited: CreditedScores, std: str = "group",
                     clip: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, N) float32 advantages of every token (module docstring), clipped to +-clip, and the (B,) bool mask of
    samples whose group had any spread (the others have advantage 0 everywhere: DAPO leaves them out)."""
    parts = credited.parts.double().numpy()
    scale = reward_scale(prompts, credited.scores.double().numpy(), std)
    centred = torch.from_numpy(centred_parts(prompts, parts) * scale[:, None])  # (B, K)
    advantages = torch.einsum("bk,bkn->bn", centred, credited.maps.double())
    if clip is not None:
        advantages = advantages.clamp(-clip, clip)
    informative = torch.from_numpy(~flat_groups(prompts, parts))
    return advantages.float(), informative


def image_advantages_as_tokens(advantages: np.ndarray, num_tokens: int) -> torch.Tensor:
    """(B,) per-image advantages -> (B, N): every token its image's (uniform credit of DDPO's per-prompt tracker)."""
    return torch.as_tensor(advantages, dtype=torch.float32)[:, None].expand(-1, num_tokens).contiguous()
